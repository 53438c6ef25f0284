"""Measurement: device-event timing of the slowest rank, statistics, memory peaks.

``summarize``, ``time_iterations`` and ``time_phases`` are re-exported lazily: the package also
holds modules the driver imports before any rank starts (``store``, ``store_cli``), whose path must
not import torch."""

from typing import Any

__all__ = ["summarize", "time_iterations", "time_phases"]


def __getattr__(name: str) -> Any:
    if name == "summarize":
        from sweepbench.measure.stats import summarize

        return summarize
    if name in ("time_iterations", "time_phases"):
        from sweepbench.measure import timing

        return getattr(timing, name)
    raise AttributeError(f"module 'sweepbench.measure' has no attribute {name!r}")
