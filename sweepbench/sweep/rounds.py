"""Rounds (``sweep.repeats=N``): a job run N times, each time a fresh launch of its ranks.

Round r of job ``<tag>`` is a whole job directory of its own, ``<tag>/rounds/<r>/`` (its
metrics.json, env.json, logs, .hydra, wandb run), written by the job exactly as a single run
writes ``<tag>/``. Once the rounds have run, the driver writes ``<tag>/metrics.json``: the job's
combined record, which readers (results.csv, the report, compare) read like any job's, with

* each case taken from the case's median round (the round whose median_s is the median of the
  rounds' medians; the lower middle one for an even N), so that its times and the rates derived
  from them stay one measurement, plus ``round_medians_s`` and ``round_mins_s``: every round's
  median and fastest sample of that case (``compare`` judges on the second);
* each summary number the median across the rounds of that number;
* status ``ok`` only when every round is ok (else the first bad round's status and error);
* ``wall_time_s``, ``timed_s`` and each of ``wall_phases_s`` summed over the rounds,
  ``rounds``: one line per round.

With ``sweep.repeats=1`` (the default) none of this exists: the job writes ``<tag>/`` itself."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Iterable

from sweepbench.record import METRICS_FILE, ROUNDS_DIR
from sweepbench.record.atomic import write_json_atomic
from sweepbench.record.readback import SweepRecords

Unit = tuple[str, "int | None"]  # (tag, round); round None: the job directory itself (repeats=1)


def rounds_of(repeats: int) -> list[int | None]:
    return [None] if repeats == 1 else list(range(1, repeats + 1))


def unit_subdir(tag: str, round_: int | None) -> str:
    """The directory of a round, relative to the sweep directory."""
    return tag if round_ is None else f"{tag}/{ROUNDS_DIR}/{round_}"


def unit_dir(sweep_dir: Path, tag: str, round_: int | None) -> Path:
    return sweep_dir / unit_subdir(tag, round_)


def _median_low_by(items: list[Any], key: Any) -> Any:
    return sorted(items, key=key)[(len(items) - 1) // 2]


def _combined_cases(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from sweepbench.report.cases import case_identity

    per_round = [{case_identity(c): c for c in m["results"].get("cases", [])} for m in rounds]
    cases = []
    for case in rounds[0]["results"].get("cases", []):
        ident = case_identity(case)
        seen = [r[ident] for r in per_round if ident in r]
        timed = [c for c in seen if isinstance(c.get("median_s"), (int, float))]
        if len(timed) < len(seen) or not timed:  # a case without a median: round 1's, as it is
            cases.append(case)
            continue
        middle = _median_low_by(timed, lambda c: c["median_s"])
        mins = [c.get("min_s") for c in timed]
        cases.append(
            {
                **middle,
                "round_medians_s": [c["median_s"] for c in timed],
                **({"round_mins_s": mins} if all(isinstance(m, (int, float)) for m in mins) else {}),
            }
        )
    return cases


def _combined_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary = dict(rounds[0]["results"].get("summary", {}))
    for key, value in summary.items():
        values = [m["results"].get("summary", {}).get(key) for m in rounds]
        if isinstance(value, (int, float)) and all(isinstance(v, (int, float)) for v in values):
            summary[key] = statistics.median(values)
    return summary


def _round_line(r: int, metrics: dict[str, Any] | None, crash: str | None, not_run: str | None) -> dict[str, Any]:
    if metrics is None and not_run is not None and crash is None:  # a stop came before it: never "failed"
        return {"round": r, "status": "not run", "error": not_run}
    if metrics is None:
        return {"round": r, "status": "failed", "error": crash or "it left no metrics.json (a rerun runs it)"}
    keys = ("status", "error", "wall_time_s", "timed_s", "started_at", "finished_at")
    return {"round": r, **{k: metrics.get(k) for k in keys}}


def combine_rounds(
    records: list[dict[str, Any] | None],
    *,
    crashed: dict[int, str] | None = None,
    not_run: dict[int, str] | None = None,
) -> dict[str, Any]:
    """The job's combined record from its rounds' metrics.json (``records[r-1]``, None if missing);
    ``not_run``: the rounds a stop of the sweep came before, with why (the job is then "not run",
    and a rerun runs what is left)."""
    crashed, not_run = crashed or {}, not_run or {}
    lines = [_round_line(r, m, crashed.get(r), not_run.get(r)) for r, m in enumerate(records, start=1)]
    present = [m for m in records if m is not None]
    bad = next((line for line in lines if line["status"] != "ok"), None)
    combined: dict[str, Any] = dict(present[0]) if present else {}
    combined.pop("wandb", None)  # each round has its own run (rounds/<r>/wandb)
    combined.update(
        {
            "repeats": len(records),
            "rounds": lines,
            "status": "ok" if bad is None else bad["status"],
            "error": None if bad is None else f"round {bad['round']} of {len(records)}: {bad['error']}",
            "verified": bad is None and all(m.get("verified") for m in present),
            "wall_time_s": sum(m.get("wall_time_s") or 0.0 for m in present),
            "timed_s": sum(m.get("timed_s") or 0.0 for m in present),
        }
    )
    combined["measuring_fraction"] = combined["timed_s"] / combined["wall_time_s"] if combined["wall_time_s"] else None
    phases = [p for p in (m.get("wall_phases_s") for m in present) if isinstance(p, dict)]
    combined["wall_phases_s"] = (
        {k: sum(p[k] for p in phases) for k in phases[0] if all(k in p for p in phases)}
        if phases and len(phases) == len(present)
        else None
    )
    if bad is None:
        combined["results"] = {
            **present[0]["results"],
            "summary": _combined_summary(present),
            "cases": _combined_cases(present),
        }
        per_rank = [m["memory"]["max"] for m in present if m.get("memory")]
        keys = {k for m in per_rank for k in m}
        combined["memory"] = {
            "max": {k: max((m[k] for m in per_rank if m.get(k) is not None), default=None) for k in sorted(keys)},
            "per_round": per_rank,
        }
    else:
        combined["results"] = {}
    if present:
        combined["started_at"], combined["finished_at"] = present[0].get("started_at"), present[-1].get("finished_at")
    return combined


def write_combined(
    records: SweepRecords,
    tags: Iterable[str],
    *,
    repeats: int,
    crashed: dict[tuple[str, int], str],
    not_run: dict[tuple[str, int], str] | None = None,
) -> None:
    """(Re)write ``<tag>/metrics.json`` of each job from its rounds 1..repeats (as ``records``, the
    sweep's records this command read, holds them; it then holds the combined one too); unchanged
    records are left alone (their mtime says when the job last changed). ``not_run``: the rounds a
    stop of the sweep came before."""
    not_run = not_run or {}
    for tag in tags:
        rounds = [records.metrics(tag, r) for r in range(1, repeats + 1)]
        rounds = [m if isinstance(m, dict) and m.get("tag") == tag else None for m in rounds]
        if not any(rounds):  # no round ever ran (e.g. a stop before the first): no record
            continue
        combined = combine_rounds(
            rounds,
            crashed={r: msg for (t, r), msg in crashed.items() if t == tag},
            not_run={r: msg for (t, r), msg in not_run.items() if t == tag},
        )
        if records.metrics(tag) != combined:
            write_json_atomic(records.path / tag / METRICS_FILE, combined)
            records.wrote(tag, combined)
