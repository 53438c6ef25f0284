"""Per-case progress, rank side: a benchmark calls ``case_done(label)`` after each case it has
measured (outside any timed region); the sweep driver shows it while the job runs.

    from sweepbench.measure.progress import case_done
    case_done("all_reduce 1 MiB", total=len(cases))

Only rank 0's calls count (others return at once); each call is one line in rank 0's log and one
small message to the driver through the job's rendezvous store, so it costs microseconds. Outside
a sweep (no sink installed) it does nothing but the log line."""

from __future__ import annotations

import time
from typing import Callable

Sink = Callable[[int, int | None, str], None]  # (cases done, total or None, label)

_state: dict[str, object] = {"rank": None, "sink": None, "done": 0, "start": time.monotonic()}


def install(*, rank: int, sink: Sink | None) -> None:
    """Called by the launcher on each rank before the benchmark runs."""
    _state.update(rank=rank, sink=sink, done=0, start=time.monotonic())


def case_done(label: str, *, total: int | None = None) -> None:
    """Report one measured case (rank 0 only; a no-op on other ranks)."""
    if _state["rank"] != 0:
        return
    done = int(_state["done"]) + 1  # type: ignore[call-overload]
    _state["done"] = done
    elapsed = time.monotonic() - float(_state["start"])  # type: ignore[arg-type]
    of = f"/{total}" if total else ""
    print(f"[{elapsed:7.1f}s] case {done}{of} done: {label}", flush=True)
    sink = _state["sink"]
    if sink is not None:
        try:
            sink(done, total, label)  # type: ignore[operator]
        except Exception:  # progress must never fail a benchmark
            pass


def cases_done() -> int:
    return int(_state["done"])  # type: ignore[call-overload]
