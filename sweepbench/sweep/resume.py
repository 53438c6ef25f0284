"""Resume: which jobs (or rounds of jobs, ``sweep.repeats``) of a sweep directory are done, and
why the others run (again).

A job (a round) is done only if its metrics.json is a JSON object that says ``ok``, names the
job's tag, and holds a config that still hashes to the job's config (a tag is a promise about the
config; an edited or stale record is not trusted). Anything else, unreadable included, is rerun.
With rounds, each round is judged on its own ``<tag>/rounds/<r>/metrics.json``: only the rounds
that are not done run again."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from omegaconf import OmegaConf

from sweepbench.record import METRICS_FILE
from sweepbench.record.env import redact_config
from sweepbench.record.readback import SweepRecords
from sweepbench.sweep.rounds import Unit, rounds_of, unit_dir
from sweepbench.sweep.tags import hash_of, tagged_container

PREVIOUS_METRICS_FILE = "metrics.previous.json"


def job_state(records: SweepRecords, job: Any, round_: int | None = None) -> str:
    """``ok``, or why the job (its round ``round_``) must run, from the sweep directory's records."""
    if not records.unit(job.tag, round_).found:
        previous = unit_dir(records.path, job.tag, round_) / PREVIOUS_METRICS_FILE
        return "its last run left no metrics.json" if previous.exists() else "not run yet"
    metrics = records.metrics(job.tag, round_)
    if not isinstance(metrics, dict):
        return "its metrics.json is unreadable"
    if metrics.get("tag") != job.tag:
        return "its metrics.json names another tag"
    if metrics.get("status") != "ok":
        return f"it ended {metrics.get('status')}"
    config = metrics.get("config")
    planned = redact_config(OmegaConf.to_container(job.cfg, resolve=True))
    if not isinstance(config, dict) or hash_of(tagged_container(config)) != hash_of(tagged_container(planned)):
        return "its recorded config does not match its tag"
    return "ok"


def resume_plan(
    records: SweepRecords, jobs: Iterable[Any], *, force: bool, repeats: int = 1
) -> tuple[set[Unit], dict[Unit, str]]:
    """(rounds already done and skipped, {round: why it runs} for the others), each round a
    ``(tag, r)`` (r None without rounds), from the sweep directory's records as read before any
    job runs."""
    done: set[Unit] = set()
    why: dict[Unit, str] = {}
    for job in jobs:
        for r in rounds_of(repeats):
            state = job_state(records, job, r)
            if state == "ok" and not force:
                done.add((job.tag, r))
            else:
                why[(job.tag, r)] = "sweep.force=true" if state == "ok" else state
    return done, why


def describe(done: set[Unit], why: dict[Unit, str], *, repeats: int = 1) -> str | None:
    """One line: how many jobs (rounds) are skipped and why the others run; None for a fresh sweep."""
    reasons = Counter(why.values())
    if not done and set(reasons) <= {"not run yet"}:
        return None
    parts = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
    what = "job(s)" if repeats == 1 else "round(s)"
    return f"resume: {len(done)} {what} already ok, skipped; {len(why)} to run" + (f" ({parts})" if parts else "")


def retire_old_metrics(sweep_dir: Path, units: Iterable[Unit]) -> None:
    """Before a job (a round) runs (again): its old metrics.json must never stand in for this
    run, if this run dies before writing its own. Kept aside as metrics.previous.json; with
    rounds, the job's combined record too (rewritten once its rounds have run)."""
    for tag, r in units:
        for old in {unit_dir(sweep_dir, tag, r) / METRICS_FILE, sweep_dir / tag / METRICS_FILE}:
            if old.exists():
                os.replace(old, old.with_name(PREVIOUS_METRICS_FILE))
