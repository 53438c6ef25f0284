"""Reading back what a sweep's jobs left, once per command: every job directory's metrics.json
and env.json, parsed, handed to each reader of that command (results.csv, the terminal summary
and ranking, report.html, resume, the combining of rounds, compare), so that they all see the
same records and no file is read twice. A sweep reads its directory before it launches (resume
judges on it) and reads again only the jobs it ran (``SweepRecords.reread``).

A job directory is a directory right under the sweep directory whose name does not start with
``.`` (``.fastest`` is the sweep's wandb ranking run) and that holds a metrics.json or, for a
job that left no record, Hydra's ``.hydra/``. A round's record (``<tag>/rounds/<r>/``) is read
when first asked for."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from sweepbench.record import ENV_FILE, METRICS_FILE, ROUNDS_DIR

MAX_RECORD_BYTES = 1 << 30  # a metrics.json beyond this is not read (a report must not need its size in memory)


@dataclass
class JobFiles:
    """One job directory's records, as read."""

    dir: Path
    found: bool = False  # it holds a metrics.json (readable or not)
    metrics: Any = None  # the metrics.json's JSON, where it could be read
    problem: str = ""  # why the metrics.json cannot be read ("" where it was read, or is missing)
    problem_path: Path | None = None  # what ``problem`` is about: the file, or the directory itself
    env: dict[str, Any] = field(default_factory=dict)  # env.json; {} where missing or unreadable

    @property
    def name(self) -> str:
        return self.dir.name


def read_metrics(path: Path) -> JobFiles:
    """``path`` (a metrics.json) read and parsed: not found, its JSON, or why it cannot be read
    (not a regular file, beyond ``MAX_RECORD_BYTES``, an OSError, not JSON)."""
    files = JobFiles(path.parent)
    try:
        if not path.exists():
            return files
        files.found = True
        if not path.is_file():
            files.problem = "not a regular file"  # a FIFO: reading it would wait for a writer
        elif path.stat().st_size > MAX_RECORD_BYTES:
            files.problem = (
                f"{path.stat().st_size / 2**20:.0f} MiB, more than a job record can be ({MAX_RECORD_BYTES >> 20} MiB)"
            )
        else:
            files.metrics = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        files.found = True
        files.problem = (err.strerror or str(err)) if isinstance(err, OSError) else str(err)
        if isinstance(err, OSError) and err.filename and Path(err.filename) == path.parent:
            files.problem_path = path.parent
    if files.problem:
        files.problem_path = files.problem_path or path
    return files


def read_env(path: Path) -> dict[str, Any]:
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return {}
        env = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return env if isinstance(env, dict) else {}


def _read_job(job_dir: Path) -> JobFiles | None:
    """The job directory's records; None where ``job_dir`` is no job directory."""
    files = read_metrics(job_dir / METRICS_FILE)
    if not files.found and not (job_dir / ".hydra").is_dir():
        return None
    files.env = read_env(job_dir / ENV_FILE)
    return files


class SweepRecords:
    """The records of one sweep directory, read once (``read_sweep``)."""

    def __init__(self, path: Path, jobs: dict[str, JobFiles]) -> None:
        self.path = path
        self.jobs = jobs  # by directory name, in name order
        self._rounds: dict[tuple[str, int], JobFiles] = {}

    def unit(self, tag: str, round_: int | None = None) -> JobFiles:
        """The records of job ``tag`` (``round_`` None) or of its round ``round_``, read when
        first asked for; ``found`` False where there is no metrics.json."""
        if round_ is None:
            return self.jobs.get(tag) or JobFiles(self.path / tag)
        if (tag, round_) not in self._rounds:
            self._rounds[tag, round_] = read_metrics(self.path / tag / ROUNDS_DIR / str(round_) / METRICS_FILE)
        return self._rounds[tag, round_]

    def metrics(self, tag: str, round_: int | None = None) -> Any | None:
        """The metrics.json (its JSON) of job ``tag`` or of its round ``round_``; None where it is
        missing or cannot be read."""
        files = self.unit(tag, round_)
        return files.metrics if not files.problem else None

    def reread(self, units: Iterable[tuple[str, int | None]]) -> None:
        """These jobs (rounds) ran since the directory was read: read their records again."""
        units = list(units)
        for tag, round_ in units:
            if round_ is not None:
                self._rounds.pop((tag, round_), None)
        for tag in dict.fromkeys(tag for tag, _ in units):
            files = _read_job(self.path / tag)
            self.jobs.pop(tag, None)
            if files is not None:
                self.jobs[tag] = files
        self.jobs = dict(sorted(self.jobs.items()))

    def wrote(self, tag: str, record: dict[str, Any]) -> None:
        """This command wrote ``record`` to ``<tag>/metrics.json`` (``write_json_atomic``): its
        readers get it as it would read back (JSON's types, keys sorted), without reading it."""
        files = self.jobs.get(tag) or JobFiles(self.path / tag)
        files.found, files.problem, files.problem_path = True, "", None
        files.metrics = json.loads(json.dumps(record, sort_keys=True, default=str))
        self.jobs = dict(sorted({**self.jobs, tag: files}.items()))


def read_sweep(path: str | Path) -> SweepRecords:
    """Every job directory of the sweep directory ``path`` (none where it does not exist yet),
    its metrics.json and env.json read."""
    path = Path(path)
    dirs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")) if path.is_dir() else []
    return SweepRecords(path, {d.name: files for d in dirs if (files := _read_job(d)) is not None})
