"""sweep.repeats on real sweeps: rounds interleaved across jobs, one results.csv row per job with
the rounds' medians, a stop in the middle of a round resumed by running only the missing rounds,
sweep.force rerunning every round, the measuring fraction and where the wall time went."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweepbench.record.recorder import WALL_PHASES
from tests.conftest import TINY, base_env, run_sweepbench

# two jobs (they differ in iters), one rank each: the cheapest sweep with two jobs
GRID = [*TINY, "parallelism=tp1", "benchmark.iters=2,3", "sweep.repeats=2"]


def _rounds(sweep_dir: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """tag -> round -> that round's metrics.json."""
    return {job.name: {int(r.name): json.loads((r / "metrics.json").read_text())
                       for r in sorted((job / "rounds").iterdir()) if (r / "metrics.json").exists()}
            for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir())}


def _combined(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/metrics.json")}


def _mtimes(sweep_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(sweep_dir)): p.stat().st_mtime_ns for p in sweep_dir.glob("*/rounds/*/metrics.json")}


def _stop_at_round_2(sweep_dir: Path) -> dict[str, Any]:
    """Run the grid, SIGTERM it once round 2 of its first job has started its rank."""
    env = base_env()
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "sweepbench", "-m", *GRID, f"hydra.sweep.dir={sweep_dir}"],
                            cwd=sweep_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if " round 2: 1 ranks starting" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=240)
    return {"rc": proc.returncode, "stdout": "".join(lines) + out, "stderr": err, "rounds": _rounds(sweep_dir),
            "mtimes": _mtimes(sweep_dir), "combined": _combined(sweep_dir)}


@pytest.fixture(scope="module")
def rounds_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    sweep_dir = tmp_path_factory.mktemp("rounds") / "sweep"
    stopped = _stop_at_round_2(sweep_dir)
    resumed = run_sweepbench(GRID, sweep_dir=sweep_dir)
    after_resume = {"rounds": _rounds(sweep_dir), "mtimes": _mtimes(sweep_dir), "results": resumed.results(),
                    "combined": _combined(sweep_dir)}
    forced = run_sweepbench([*[a for a in GRID if not a.startswith("benchmark.iters=")], "benchmark.iters=2",
                             "sweep.force=true"], sweep_dir=sweep_dir)
    return {"dir": sweep_dir, "stopped": stopped, "resumed": resumed, "after_resume": after_resume,
            "forced": forced, "after_force": {"mtimes": _mtimes(sweep_dir), "rounds": _rounds(sweep_dir)}}


def test_rounds_are_interleaved_across_jobs(rounds_runs: dict[str, Any]) -> None:
    stopped = rounds_runs["stopped"]
    assert stopped["rc"] == 128 + signal.SIGTERM, stopped["stderr"][-3000:]
    rounds = stopped["rounds"]
    assert len(rounds) == 2
    first, second = sorted(rounds, key=lambda tag: rounds[tag][1]["started_at"])
    # round 1 of both jobs, then round 2 of the first (stopped there): never two rounds of a job in a row
    order = [rounds[first][1], rounds[second][1], rounds[first][2]]
    assert [m["started_at"] for m in order] == sorted(m["started_at"] for m in order)
    assert order[0]["finished_at"] <= order[1]["started_at"] and order[1]["finished_at"] <= order[2]["started_at"]
    assert [m["status"] for m in order] == ["ok", "ok", "interrupted"]
    assert 2 not in rounds[second]
    # the combined records say what is missing
    combined = stopped["combined"]
    assert combined[first]["status"] == "interrupted" and combined[first]["error"].startswith("round 2 of 2: ")
    # the round the stop came before is not run, never "failed"
    assert combined[second]["status"] == "not run", combined[second]
    assert combined[second]["error"] == "round 2 of 2: not started: the sweep was stopped by SIGTERM first"
    assert combined[second]["rounds"][1] == {"round": 2, "status": "not run", "error": combined[second]["error"][14:]}
    assert "failed" not in stopped["stdout"], stopped["stdout"][-3000:]


def test_resume_runs_only_the_missing_rounds(rounds_runs: dict[str, Any]) -> None:
    before, after = rounds_runs["stopped"]["mtimes"], rounds_runs["after_resume"]["mtimes"]
    resumed = rounds_runs["resumed"]
    assert resumed.rc == 0, resumed.describe()
    assert "resume: 2 round(s) already ok, skipped; 2 to run (1 it ended interrupted, 1 not run yet)" in resumed.stdout
    ones = {k for k in after if k.endswith("/rounds/1/metrics.json")}
    assert len(ones) == 2 and all(after[k] == before[k] for k in ones)  # round 1 did not run again
    assert len(after) == 4 and all(after[k] > before.get(k, 0) for k in set(after) - ones)
    assert all(m["status"] == "ok" for r in rounds_runs["after_resume"]["rounds"].values() for m in r.values())


def test_results_csv_has_one_row_per_job_with_the_rounds_medians(rounds_runs: dict[str, Any]) -> None:
    table = rounds_runs["after_resume"]["results"]
    rounds = rounds_runs["after_resume"]["rounds"]
    assert sorted(table["tag"]) == sorted(rounds) and (table["status"] == "ok").all()
    assert (table["repeats"] == 2).all() and table["this_run"].all()
    for row in table.to_dict("records"):
        per_round = [rounds[row["tag"]][r]["results"]["summary"]["all_reduce_median_s"] for r in (1, 2)]
        assert [float(x) for x in row["all_reduce_median_s_rounds"].split(";")] == pytest.approx(per_round, rel=1e-5)
        # the headline number: the median across rounds (of 2: their mean)
        assert row["all_reduce_median_s"] == pytest.approx(sum(per_round) / 2)
        walls = [rounds[row["tag"]][r]["wall_time_s"] for r in (1, 2)]
        # a sample of a batched collective stands for ops_per_sample operations: timed counts each
        cases = [rounds[row["tag"]][r]["results"]["cases"] for r in (1, 2)]
        assert all(c["ops_per_sample"] >= 1 for cs in cases for c in cs)
        timed = [sum(sum(c["times_s"]) * c["ops_per_sample"] for c in cs) for cs in cases]
        assert [rounds[row["tag"]][r]["timed_s"] for r in (1, 2)] == pytest.approx(timed)
        assert row["wall_time_s"] == pytest.approx(sum(walls))
        assert row["timed_s"] == pytest.approx(sum(timed))
        assert row["measuring_fraction"] == pytest.approx(sum(timed) / sum(walls)) and 0 < row["measuring_fraction"] < 1
        combined = rounds_runs["after_resume"]["combined"][row["tag"]]
        # where each round's wall time went: rank 0's phases and the rest, adding up to the round's
        # wall time (the ranks are forked from the warm interpreter: their start is the fork's)
        phases = [rounds[row["tag"]][r]["wall_phases_s"] for r in (1, 2)]
        assert [rounds[row["tag"]][r]["rank_start"] for r in (1, 2)] == ["forked", "forked"]
        for phase, wall in zip(phases, walls):
            assert list(phase) == sorted(WALL_PHASES) and min(phase.values()) >= 0, phase
            assert sum(phase.values()) == pytest.approx(wall) and phase["start"] >= 0 and phase["benchmark"] > 0
        for key in WALL_PHASES:  # a job of rounds: each phase summed over them, in the record and the row
            assert combined["wall_phases_s"][key] == pytest.approx(sum(p[key] for p in phases))
            assert row[f"wall_{key}_s"] == pytest.approx(combined["wall_phases_s"][key])
        (case,) = combined["results"]["cases"]
        medians = [rounds[row["tag"]][r]["results"]["cases"][0]["median_s"] for r in (1, 2)]
        assert case["round_medians_s"] == medians
        assert case["median_s"] == min(medians)  # the case of the median round (the lower of 2)
        assert [line["round"] for line in combined["rounds"]] == [1, 2]
    assert "measuring fraction" in rounds_runs["resumed"].stdout
    went = re.search(r"job wall time went to rank start-up \(interpreter, imports\) ([\d.]+) s, process groups "
                     r"[\d.]+ s, benchmarks \(set-up, verification, warm-up, timing\) ([\d.]+) s, teardown [\d.]+ s, "
                     r"launch and record [\d.]+ s", rounds_runs["resumed"].stdout)
    assert went and float(went.group(1)) > 0 and float(went.group(2)) > 0, rounds_runs["resumed"].stdout


def test_force_reruns_every_round(rounds_runs: dict[str, Any]) -> None:
    forced, before, after = rounds_runs["forced"], rounds_runs["after_resume"]["mtimes"], rounds_runs["after_force"]["mtimes"]
    assert forced.rc == 0, forced.describe()
    assert "resume: 0 round(s) already ok, skipped; 2 to run (2 sweep.force=true)" in forced.stdout
    rerun = {k for k in after if after[k] != before[k]}
    assert len(rerun) == 2 and len({k.split("/")[0] for k in rerun}) == 1  # both rounds of the one job
    assert {k.split("/")[2] for k in rerun} == {"1", "2"}


def test_repeats_is_not_part_of_the_tag(compose) -> None:
    from tests.conftest import planned_tag

    assert planned_tag(compose, *TINY, "sweep.repeats=3") == planned_tag(compose, *TINY)


def test_bad_repeats_is_one_line_exit_2(tmp_path: Path) -> None:
    run = run_sweepbench([*TINY, "sweep.repeats=0"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2 and run.stderr.strip() == "sweepbench: error: sweep.repeats=0 must be >= 1 (how many times each job runs)"
    assert not (tmp_path / "sweep").exists()


def test_compare_leaves_one_rank_collectives_out(rounds_runs: dict[str, Any], tmp_path: Path) -> None:
    """This sweep's jobs are one-rank collectives: they move no data, so compare judges none of
    their cases (a sweep of rounds that moves data: tests/report/test_verdicts.py)."""
    from tests.report.conftest import sweepbench_cli

    proc = sweepbench_cli("compare", rounds_runs["dir"], rounds_runs["dir"], "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    assert len(pd.read_csv(tmp_path / "compare.csv")) == 0 and "0 cases" in proc.stdout
    proc = sweepbench_cli("compare", rounds_runs["dir"], rounds_runs["dir"], "-o", tmp_path, "--fail-on-regression")
    assert proc.returncode == 4 and "no case was compared" in proc.stderr, proc.stderr
