"""Measurement: device-event timing of the slowest rank, statistics, memory peaks."""

from sweepbench.measure.stats import summarize
from sweepbench.measure.timing import time_iterations

__all__ = ["summarize", "time_iterations"]
