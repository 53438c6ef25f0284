"""Ctrl-C and SIGTERM during a local sweep: the first signal asks the running job to stop (its
ranks are killed and it is recorded ``interrupted``), then no further job starts and the driver
writes results.csv and the summary for what finished. A second signal interrupts at once."""

from __future__ import annotations

import signal
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: list[int] = []


class SweepInterrupted(BaseException):
    """Raised (a BaseException, so Hydra's per-job error capture lets it through) to stop the
    sweep's launch loop at the next job boundary."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def requested() -> int | None:
    """The signal that asked the sweep to stop, if one did."""
    return _requested[0] if _requested else None


def check() -> None:
    """At a job boundary: stop here if a stop was asked for."""
    if _requested:
        raise SweepInterrupted(_requested[0])


def _handler(signum: int, frame: object) -> None:
    if _requested:  # the second signal: stop now
        raise SweepInterrupted(signum)
    _requested.append(signum)


def install() -> Callable[[], None]:
    """Install the handlers; returns a function that restores the previous ones."""
    _requested.clear()
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
