"""The report engine: the self-contained HTML report of a sweep (its figures drawn with
``sweepbench.draw``), comparisons of two sweeps with a noise-aware verdict, and wandb workspace
views. Nothing here runs on a rank.

The package import stays light (the CLI imports it before deciding whether Hydra runs):
import the modules you need (``sweepbench.report.page``, ``.compare``)."""

from pathlib import Path
from typing import Any


def write_sweep_report(sweep_dir: str | Path, **made: Any) -> Path:
    """``<sweep>/report.html``; see ``sweepbench.report.page.write_sweep_report``."""
    from sweepbench.report.page import write_sweep_report as write

    return write(sweep_dir, **made)
