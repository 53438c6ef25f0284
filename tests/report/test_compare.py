"""compare on real sweeps of five rounds each: the same config twice (run side by side) is not
`slower`; a job slowed down by a known factor inside its timed region (fault.kind=slow
fault.factor=3) is, against its clean twin, judged on the rounds. Sweeps without rounds are judged
on samples, and the output says that process-to-process noise is not covered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from ..conftest import SweepRun
from .browser import visit
from .conftest import COMPARE_ROUNDS, SLOW_FACTOR, sweepbench_cli


def _compare(a: SweepRun, b: SweepRun, out: Path, *extra: str) -> tuple[int, pd.DataFrame, str]:
    proc = sweepbench_cli("compare", a.sweep_dir, b.sweep_dir, "-o", out, *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, pd.read_csv(out / "compare.csv"), proc.stdout


def test_same_config_twice_is_not_slower(compare_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    """The gate never calls an identical rerun slower (or faster): it passes (0) when the twins'
    ratio is within the threshold, and where chance puts it beyond the threshold without the test
    agreeing (``~``: this refit's speed is bimodal between processes on a 2-core box, and each twin
    draws its own five) it fails closed, 4, saying what would decide."""
    proc = sweepbench_cli("compare", compare_sweeps["twin_a"].sweep_dir, compare_sweeps["twin_b"].sweep_dir,
                          "-o", tmp_path, "--fail-on-regression")
    rc, table, out = proc.returncode, pd.read_csv(tmp_path / "compare.csv"), proc.stdout + proc.stderr
    assert len(table) == 1, out  # one job, one case, joined by config (same tag)
    row = table.iloc[0]
    (tag,) = compare_sweeps["base"].all_metrics()
    assert row["baseline_tag"] == row["candidate_tag"] == tag
    assert row["basis"] == "rounds" and row["n_baseline"] == row["n_candidate"] == COMPARE_ROUNDS
    assert (row["verdict"], rc) in (("unchanged", 0), ("~", 4)), (row.to_dict(), out)
    if rc == 4:
        assert "undecided: no case of 1 was decided" in out and "sweep.repeats >" in out, out
    assert "process-to-process noise" not in out
    assert "ran apart" not in out  # their rounds overlapped in time: no note


def test_sweeps_run_apart_are_said_to_miss_the_machine_between_them(compare_sweeps: dict[str, SweepRun],
                                                                    tmp_path: Path) -> None:
    """base and slow ran one after the other: their rounds did not interleave, and compare says
    so, with when each ran; a sweep against itself (the same rounds) gets no such note."""
    base, later = compare_sweeps["base"], compare_sweeps["slow"]
    _, _, stdout = _compare(base, later, tmp_path / "apart")
    (metrics_b,), (metrics_t,) = ([json.loads(p.read_text()) for p in run.sweep_dir.glob("*/metrics.json")]
                                  for run in (base, later))
    assert metrics_b["finished_at"] <= metrics_t["started_at"]
    note = re.search(r"note: the sweeps ran apart \((\S+ [\d:]+)-([\d:]+) UTC and (\S+ [\d:]+)-([\d:]+) UTC\)", stdout)
    assert note, stdout
    assert note.group(1) == f"{metrics_b['started_at'][:10]} {metrics_b['started_at'][11:16]}"
    assert note.group(4) == metrics_t["finished_at"][11:16]
    assert "run both configurations in one sweep" in stdout
    assert "the sweeps ran apart" in (tmp_path / "apart" / "compare.html").read_text()
    _, _, stdout = _compare(base, base, tmp_path / "same")
    assert "ran apart" not in stdout and "note:" not in stdout


def test_known_slowdown_is_slower(compare_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    base, slow = compare_sweeps["base"], compare_sweeps["slow"]
    rc, table, stdout = _compare(base, slow, tmp_path, "--fail-on-regression")
    assert len(table) == 1, stdout
    row = table.iloc[0]
    # joined with its clean twin although its tag differs (fault.* is not part of the join)
    assert row["baseline_tag"] != row["candidate_tag"]
    assert row["verdict"] == "slower", row.to_dict()
    assert row["basis"] == "rounds" and row["n_baseline"] == row["n_candidate"] == COMPARE_ROUNDS
    assert row["ratio"] > row["threshold"] and row["p_value"] < 0.01
    # the injected wait triples the step; the timed region also holds a little that is not slowed
    assert row["ci_low"] <= SLOW_FACTOR * 1.15 and row["ci_high"] >= 1 + 0.5 * (SLOW_FACTOR - 1)
    assert rc == 1 and "slower" in stdout
    # the same pair without --fail-on-regression: the verdict is reported, the exit is 0
    rc, _, _ = _compare(base, slow, tmp_path / "again")
    assert rc == 0


def test_comparison_page(compare_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    _compare(compare_sweeps["base"], compare_sweeps["slow"], tmp_path)
    seen = visit(tmp_path / "compare.html")
    assert seen.console_errors == [] and seen.requests == [(tmp_path / "compare.html").as_uri()]
    assert [f["title"] for f in seen.figures] == ["refit ratio heatmap"]
    assert seen.figures[0]["width"] > 100 and seen.figures[0]["drawn"] > 20
    assert "slower: 1" in seen.text


def test_join_on_named_columns(compare_sweeps: dict[str, SweepRun], report_sweeps: dict[str, SweepRun],
                               tmp_path: Path) -> None:
    rc, table, _ = _compare(compare_sweeps["base"], compare_sweeps["slow"], tmp_path, "--on", "benchmark,model")
    assert list(table["verdict"]) == ["slower"]
    # the collective sweep's two jobs share benchmark and model: the join says which columns to add
    coll = report_sweeps["collective"]
    proc = sweepbench_cli("compare", coll.sweep_dir, coll.sweep_dir, "-o", tmp_path / "x", "--on", "model")
    assert proc.returncode == 2 and "have the same join key" in proc.stderr and "--on" in proc.stderr
    refit = report_sweeps["refit"]
    rc, table, stdout = _compare(refit, refit, tmp_path / "y", "--on", "model,strategy")
    assert len(table) == 1 and set(table["verdict"]) <= {"unchanged", "~", "unstable"}
    assert (table["note"].str.contains("reach p < 0.002")).all()  # 3 iterations: never significant
    # a sweep without rounds: judged on one process's samples, and the output says what that misses
    assert list(table["basis"]) == ["samples"]
    assert table["note"].str.contains("process-to-process noise not covered").all()
    assert "note: process-to-process noise is not covered: 1 case(s)" in stdout
    assert "process-to-process noise is not covered" in (tmp_path / "y" / "compare.html").read_text()


def test_failed_candidate_job(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    """The collective sweep against itself: its failed job (fault.kind=raise) is listed, not compared."""
    coll = report_sweeps["collective"]
    proc = sweepbench_cli("compare", coll.sweep_dir, coll.sweep_dir, "-o", tmp_path, "--on", "fault.kind")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "compare.csv")
    failed = table[table["verdict"] == "not compared"]
    assert len(failed) == 1 and "injected fault" in failed.iloc[0]["note"]


@pytest.mark.parametrize("args, message", [
    (["--p-value", "2"], "p_value=2.0 must be in (0, 1)"),
    (["--on", "no_such_column"], "--on column 'no_such_column' is not in job"),
])
def test_bad_options(compare_sweeps: dict[str, SweepRun], tmp_path: Path, args: list[str], message: str) -> None:
    proc = sweepbench_cli("compare", compare_sweeps["base"].sweep_dir, compare_sweeps["slow"].sweep_dir,
                          "-o", tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
