"""Measurement: device-event timing of the slowest rank, statistics, memory peaks.

``summarize`` and ``time_iterations`` are re-exported lazily: the package also holds modules the
driver imports before any rank starts (``store``, ``store_cli``), whose path must not import torch."""

from typing import Any

__all__ = ["summarize", "time_iterations"]


def __getattr__(name: str) -> Any:
    if name == "summarize":
        from sweepbench.measure.stats import summarize

        return summarize
    if name == "time_iterations":
        from sweepbench.measure.timing import time_iterations

        return time_iterations
    raise AttributeError(f"module 'sweepbench.measure' has no attribute {name!r}")
