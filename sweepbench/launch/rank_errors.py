"""Which rank failed first. A rank that raises records when, in ``.rank<N>_error.json`` in the
job dir; its peers then fail too ("connection closed"), later. The launchers (local and SLURM)
report the earliest record as the job's error."""

from __future__ import annotations

import signal
import sys
import time
import traceback
from pathlib import Path

from sweepbench.record.atomic import read_json, write_json_atomic

PATTERN = ".rank*_error.json"


def exit_how(code: int) -> str:
    """How a rank's process ended, from its return code: ``exit code 3``, ``signal SIGKILL``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def clear_rank_errors(job_dir: Path) -> None:
    for stale in job_dir.glob(PATTERN):
        stale.unlink(missing_ok=True)


def note_rank_error(job_dir: Path, rank: int, err: BaseException) -> None:
    """Called in the failing rank: its traceback to its log (stderr), and the record."""
    failed_at = time.time_ns()
    traceback.print_exc()
    sys.stderr.flush()
    write_json_atomic(
        job_dir / f".rank{rank}_error.json",
        {"rank": rank, "time_ns": failed_at, "error": traceback.format_exception_only(err)[-1].strip()},
    )


def first_raised(job_dir: Path) -> str | None:
    """``rank N: <error>`` of the rank that raised first, if any did."""
    records = [r for path in job_dir.glob(PATTERN) if (r := read_json(path))]
    if not records:
        return None
    first = min(records, key=lambda r: r["time_ns"])
    return f"rank {first['rank']}: {last_line(first['error'])}"


def has_record(job_dir: Path, rank: int) -> bool:
    """Did this rank note an error (it raised) rather than die?"""
    return (job_dir / f".rank{rank}_error.json").exists()
