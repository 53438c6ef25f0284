"""sweepbench: Hydra-composed sweeps of distributed PyTorch benchmarks."""

__version__ = "0.1.0"
