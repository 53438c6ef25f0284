"""Progress while a local sweep runs: job i of N with the elapsed time and an estimate of what is
left, and on a terminal a live line with the running job's cases (rich), fed by the ranks'
``sweepbench.measure.progress.case_done`` through the job's store. Job lines are plain prints,
so a log or a pipe gets them too; there, instead of the live line, a running job prints a line
every ``PLAIN_EVERY_S`` seconds (its elapsed time and its last case)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.status import Status

PLAIN_EVERY_S = 30.0  # not a terminal: a line this often while a job runs


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


@dataclass
class SweepStatus:
    tags: list[str]  # the jobs (rounds of jobs: ``unit_label``) this invocation launches, in order
    start: float = field(default_factory=time.monotonic)
    durations: list[float] = field(default_factory=list)
    started: set[str] = field(default_factory=set)  # the jobs (rounds) that began starting their ranks
    _job_start: float = 0.0
    _tag: str = ""
    _what: str = "starting"
    _live: Status | None = None
    _said: float = 0.0  # when the last plain progress line of the running job was printed

    def index(self, tag: str) -> int:
        return self.tags.index(tag) + 1 if tag in self.tags else len(self.durations) + 1

    def estimate(self) -> str:
        if not self.durations:
            return "no estimate yet"
        left = (len(self.tags) - len(self.durations)) * sum(self.durations) / len(self.durations)
        return f"about {_clock(left)} left"

    def job_started(self, tag: str, world_size: int) -> None:
        self._tag, self._job_start = tag, time.monotonic()
        self.started.add(tag)
        print(
            f"[{self.index(tag)}/{len(self.tags)}] {tag}: {world_size} ranks starting "
            f"(sweep {_clock(time.monotonic() - self.start)} elapsed, {self.estimate()})",
            flush=True,
        )
        self._what, self._said = "running, no case reported yet", self._job_start
        console = Console(file=sys.stdout)
        if console.is_terminal:
            self._live = console.status(self._line())
            self._live.start()

    def _line(self) -> str:
        return f"[{self.index(self._tag)}/{len(self.tags)}] {self._what} ({_clock(time.monotonic() - self._job_start)})"

    def case_done(self, done: int, total: int | None, label: str) -> None:
        of = f"/{total}" if total else ""
        self._what = f"case {done}{of}: {label}"
        if self._live is not None:
            self._live.update(self._line())

    def tick(self) -> None:
        if self._live is not None:
            self._live.update(self._line())
        elif time.monotonic() - self._said >= PLAIN_EVERY_S:
            self._said = time.monotonic()
            print(
                f"[{self.index(self._tag)}/{len(self.tags)}] {self._tag}: {self._what} "
                f"({_clock(time.monotonic() - self._job_start)})",
                flush=True,
            )

    def job_finished(self, status: str, error: str | None = None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        took = time.monotonic() - self._job_start
        self.durations.append(took)
        why = f": {error}" if error else ""
        print(f"[{self.index(self._tag)}/{len(self.tags)}] {self._tag}: {status} in {took:.1f}s{why}", flush=True)


def unit_label(tag: str, round_: int | None) -> str:
    """How a job (a round of a job, ``sweep.repeats``) is named in the progress lines."""
    return tag if round_ is None else f"{tag} round {round_}"


def job_label(job_dir: Path) -> str:
    """The label of the job (round) whose directory is ``job_dir`` (``<tag>`` or ``<tag>/rounds/<r>``)."""
    from sweepbench.record import ROUNDS_DIR

    if job_dir.parent.name == ROUNDS_DIR and job_dir.name.isdigit():
        return unit_label(job_dir.parent.parent.name, int(job_dir.name))
    return job_dir.name


_current: list[SweepStatus] = []


def begin(tags: list[str]) -> SweepStatus:
    _current[:] = [SweepStatus(tags)]
    return _current[0]


def current() -> SweepStatus | None:
    return _current[0] if _current else None


def end() -> None:
    _current.clear()
