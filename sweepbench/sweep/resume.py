"""Resume: which jobs of a sweep directory are done, and why the others run (again).

A job is done only if its metrics.json is a JSON object that says ``ok``, names the job's tag,
and holds a config that still hashes to the job's config (a tag is a promise about the config;
an edited or stale record is not trusted). Anything else, unreadable included, is rerun."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from omegaconf import OmegaConf

from sweepbench.record import METRICS_FILE
from sweepbench.record.atomic import read_json
from sweepbench.record.env import redact_config
from sweepbench.sweep.tags import hash_of, tagged_container

PREVIOUS_METRICS_FILE = "metrics.previous.json"


def job_state(sweep_dir: Path, job: Any) -> str:
    """``ok``, or why the job must run."""
    path = sweep_dir / job.tag / METRICS_FILE
    if not path.exists():
        return "its last run left no metrics.json" if path.with_name(PREVIOUS_METRICS_FILE).exists() else "not run yet"
    metrics = read_json(path)
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


def resume_plan(sweep_dir: Path, jobs: Iterable[Any], *, force: bool) -> tuple[set[str], dict[str, str]]:
    """(tags already done and skipped, {tag: why it runs} for the others)."""
    done: set[str] = set()
    why: dict[str, str] = {}
    for job in jobs:
        state = job_state(sweep_dir, job)
        if state == "ok" and not force:
            done.add(job.tag)
        else:
            why[job.tag] = "sweep.force=true" if state == "ok" else state
    return done, why


def describe(done: set[str], why: dict[str, str]) -> str | None:
    """One line: how many jobs are skipped and why the others run; None for a fresh sweep."""
    reasons = Counter(why.values())
    if not done and set(reasons) <= {"not run yet"}:
        return None
    parts = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
    return (f"resume: {len(done)} job(s) already ok, skipped; {len(why)} to run"
            + (f" ({parts})" if parts else ""))


def retire_old_metrics(sweep_dir: Path, tags: Iterable[str]) -> None:
    """Before a job runs (again): its old metrics.json must never stand in for this run, if this
    run dies before writing its own. Kept aside as metrics.previous.json."""
    for tag in tags:
        old = sweep_dir / tag / METRICS_FILE
        if old.exists():
            os.replace(old, old.with_name(PREVIOUS_METRICS_FILE))
