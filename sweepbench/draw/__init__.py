"""The drawing kit: matplotlib figures (``plotting``) and units as people read them (``units``).

Engines and benchmark plugins draw their figures with it and the report engine lays them out; it
imports nothing of sweepbench, so every layer above may use it. The package import stays light:
import the module you need."""
