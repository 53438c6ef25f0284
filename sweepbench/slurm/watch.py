"""Waiting for a sweep's submitit jobs: one state query per poll for all of them (``squeue`` and
``sacct`` on SLURM), a line whenever a job's state or the pending / running / done / failed
counts change, and each finished job's final state, exit code and stderr tail. A job SLURM would
never start (e.g. more nodes than its partition has) is cancelled rather than waited for."""

from __future__ import annotations

import getpass
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from sweepbench.core import Registry
from sweepbench.record.atomic import read_json

PENDING = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "RESIZING",
        "SUSPENDED",
        "UNKNOWN",
        "PREEMPTED",
    }
)  # PREEMPTED: awaiting its requeue
RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"})
# Pending reasons that do not pass: the request exceeds what the partition or account allows.
NEVER_STARTS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "DependencyNeverSatisfied",
    }
)
PREEMPTED_GRACE_S = 300.0  # a job PREEMPTED this long without being requeued is over
HEARTBEAT_S = 60.0
TAIL_LINES = 3  # per log file
TAIL_CHARS = 2000
SLURM_PREFIXES = ("srun: error", "slurmstepd")
SLURM_LINES = 4
LINE_CHARS = 240
READ_BYTES = 256 * 1024  # of a log's end
_SRUN_TASK_DIED = re.compile(r"srun: error: (\S+): (tasks? [\d,-]+: .+)$")  # node, task(s) and how
NOISE_PREFIXES = ("=====", "submitit ")  # attempt headers, submitit's own log lines
NOISE_MARKS = ("][submitit][", "][INFO] - ", "][DEBUG] - ")  # log records below WARNING


@dataclass
class JobState:
    state: str = "UNKNOWN"  # SLURM's job state (first word: "CANCELLED by 0" -> CANCELLED)
    exit_code: str | None = None  # SLURM's "code:signal"
    elapsed_s: float | None = None
    reason: str | None = None  # why a pending job waits, per squeue (e.g. Resources, Priority)

    def describe(self) -> str:
        waits = self.state in PENDING and self.reason not in (None, "", "None")
        return f"{self.state} ({self.reason})" if waits else self.state


@dataclass
class Tracked:
    """One submitted job: its submitit handle, what sweepbench knows of it, its latest state."""

    job: Any  # submitit.Job
    tag: str
    job_dir: Path
    world_size: int
    info: JobState = field(default_factory=JobState)
    finished: bool = False
    since: float = field(default_factory=time.monotonic)  # when the state last changed
    said: str | None = None  # the state last reported
    never: str | None = None  # SLURM's reason why it would never start (the sweep cancelled it)

    def task_outcomes(self) -> list[str | None]:
        """Each task's outcome per its result pickle: "success", "error", or None (none yet)."""
        from submitit.core.utils import pickle_load

        outcomes: list[str | None] = []
        for t in range(self.job.num_tasks):
            path = self.job.task(t).paths.result_pickle
            try:
                outcomes.append(pickle_load(path)[0] if path.exists() else None)
            except Exception:  # being written
                outcomes.append(None)
        return outcomes

    def category(self) -> str:
        if not self.finished:
            return "running" if self.info.state in RUNNING else "pending"
        metrics = read_json(self.job_dir / "metrics.json") or {}
        return "done" if metrics.get("status") == "ok" else "failed"


class Watcher(Protocol):
    def refresh(self, jobs: list[Tracked]) -> None: ...


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # keep the last known states; the next poll tries again


class SlurmWatcher:
    """All jobs' states from one ``squeue`` call (live, from slurmctld) and one ``sacct`` call
    (accounting: exit codes, run times, and the state of jobs squeue no longer lists)."""

    def refresh(self, jobs: list[Tracked]) -> None:
        from submitit.slurm.slurm import SlurmInfoWatcher

        ids = sorted({str(t.job.job_id).split("_")[0] for t in jobs})
        if not ids:
            return
        read = SlurmInfoWatcher().read_info  # knows array ids and ranges ("12_[3-5]")
        queue = _run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%r"])
        acct = _run(
            [
                "sacct",
                "-X",
                "--parsable2",
                "-o",
                "JobID,State,ExitCode,ElapsedRaw",
                *[arg for job_id in ids for arg in ("-j", job_id)],
            ]
        )
        queued = read("JobID|State|Reason\n" + queue) if queue is not None else {}
        accounted = read(acct) if acct is not None else {}
        for t in jobs:
            in_queue, row = queued.get(str(t.job.job_id)), accounted.get(str(t.job.job_id))
            live = _state(in_queue)
            if live in PENDING | RUNNING:
                # still in slurmctld's queue: not over, whatever accounting says of an attempt that
                # ended (a requeued job's last attempt can read FAILED while it waits to run again)
                t.info.state, t.info.reason = live, (in_queue or {}).get("Reason")
            elif row and _state(row) not in PENDING | RUNNING:  # over, per accounting: the final word
                elapsed = row.get("ElapsedRaw") or ""
                t.info = JobState(
                    _state(row), row.get("ExitCode") or None, float(elapsed) if elapsed.isdigit() else None
                )
            elif live:  # over per slurmctld but not yet in accounting: wait for its exit code
                t.info.state = "COMPLETING" if live not in PENDING | RUNNING and acct is not None else live
                t.info.reason = (in_queue or {}).get("Reason")
            elif row:
                t.info.state = _state(row)
            if t.info.state == "PENDING" and t.info.reason in NEVER_STARTS and t.never is None:
                t.never = t.info.reason  # it would wait forever, and the sweep with it
                _run(["scancel", str(t.job.job_id)])


def _state(row: dict[str, str] | None) -> str:
    """A row's state, first word only ("CANCELLED by 0" -> CANCELLED); "" without a row."""
    return ((row or {}).get("State") or "").split(" ")[0]


class LocalWatcher:
    """submitit's local executor: a job runs while its controller process lives."""

    def refresh(self, jobs: list[Tracked]) -> None:
        for t in jobs:
            if t.job.state == "RUNNING":
                t.info = JobState(state="RUNNING", elapsed_s=time.monotonic() - t.since)
            else:
                ok = all(o == "success" for o in t.task_outcomes())
                t.info = JobState(state="COMPLETED" if ok else "FAILED", elapsed_s=t.info.elapsed_s)


WATCHERS: Registry[Callable[[], Watcher]] = Registry("cluster watcher")
WATCHERS.add("slurm", SlurmWatcher)
WATCHERS.add("local", LocalWatcher)


def is_final(t: Tracked) -> bool:
    """Over: SLURM says so, or every task has returned (errors wait for SLURM's final state)."""
    state = t.info.state
    if state == "PREEMPTED" and time.monotonic() - t.since > PREEMPTED_GRACE_S:
        return True
    if state not in PENDING and state not in RUNNING:
        return True
    return all(o == "success" for o in t.task_outcomes())


def wait_all(jobs: list[Tracked], watcher: Watcher, *, poll_s: float, label: str, say: Callable[[str], None]) -> None:
    """Poll until every job is over, saying what changes."""
    start = last_said = time.monotonic()
    last_counts: Counter[str] | None = None
    while True:
        open_jobs = [t for t in jobs if not t.finished]
        watcher.refresh(open_jobs)
        for t in open_jobs:
            if t.info.describe() != t.said:
                if t.said is not None or t.info.state != "UNKNOWN":
                    say(f"{label} job {t.job.job_id} {t.tag}: {t.info.describe()}")
                if t.info.state != (t.said or "").split(" ")[0]:
                    t.since = time.monotonic()
                t.said = t.info.describe()
            t.finished = is_final(t)
            if t.finished:
                say(f"{label} job {t.job.job_id} {t.tag}: finished, {t.category()}")
        counts = Counter(t.category() for t in jobs)
        now = time.monotonic()
        if counts != last_counts or now - last_said > HEARTBEAT_S:
            say(
                f"{label}: {len(jobs)} jobs: {counts['pending']} pending, {counts['running']} running, "
                f"{counts['done']} done, {counts['failed']} failed ({now - start:.0f}s)"
            )
            last_counts, last_said = counts, now
        if all(t.finished for t in jobs):
            return
        time.sleep(poll_s)


def _useful_lines(path: Path) -> list[str]:
    """A log's lines without the noise: blank lines, attempt headers, submitit's and INFO log
    records, srun's step bookkeeping, Python warnings (and the source line that follows each)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - READ_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    kept: list[str] = []
    skip_next = False
    for line in (ln.strip() for ln in lines):
        if skip_next:
            skip_next = False
            continue
        if "Warning: " in line:
            skip_next = True
            continue
        if not line or line.startswith(NOISE_PREFIXES) or any(mark in line for mark in NOISE_MARKS):
            continue
        if line.startswith("srun: ") and not line.startswith(SLURM_PREFIXES):
            continue  # srun's own step bookkeeping
        kept.append(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "...")
    return kept


def died_how(t: Tracked) -> str | None:
    """srun's word on the first task that died and its node, e.g. "node n2, task 3: Killed"."""
    for task in range(t.job.num_tasks):
        for line in _useful_lines(t.job.task(task).paths.stderr):
            if match := _SRUN_TASK_DIED.match(line):
                return f"node {match.group(1)}, {match.group(2)}"
    return None


def stderr_tail(t: Tracked) -> str:
    """How the job ended, as one line: SLURM's own messages first (srun's "task 1: Killed",
    slurmstepd's "CANCELLED ... DUE TO TIME LIMIT"), then the last lines of every rank's log
    and of submitit's stderr files."""
    files = [t.job.task(task).paths.stderr for task in range(t.job.num_tasks)]
    slurm = [ln for path in files for ln in _useful_lines(path) if ln.startswith(SLURM_PREFIXES)]
    parts = [" / ".join(slurm[:SLURM_LINES])] if slurm else []
    logs = [t.job_dir / "logs" / f"rank{rank}.log" for rank in range(t.world_size)]
    for path in [*logs, *files]:
        lines = [ln for ln in _useful_lines(path) if not ln.startswith(SLURM_PREFIXES)][-TAIL_LINES:]
        if lines:
            parts.append(f"{path.name}: " + " / ".join(lines))
    text = " | ".join(parts)
    return text if len(text) <= TAIL_CHARS else text[:TAIL_CHARS] + "..."
