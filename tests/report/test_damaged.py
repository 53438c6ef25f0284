"""Damaged and extreme records: report and compare name each job they cannot read as
``unreadable`` (with the file and what is wrong) and go on with the rest, never a traceback; a
results.csv that cannot be read gives way to the jobs' metrics.json files; a record's size decides
neither the page's size nor the memory of the statistics (samples are thinned). Each case damages
a copy of one real 2-job sweep."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from sweepbench.report.load import MAX_SAMPLES, UNREADABLE, load_sweep

from ..conftest import TINY, SweepRun, run_sweepbench
from .conftest import sweepbench_cli


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    run = run_sweepbench([*TINY, "parallelism=tp1,tp2"], sweep_dir=tmp_path_factory.mktemp("damaged") / "base")
    assert run.rc == 0, run.describe()
    return run


def _copy(sweep: SweepRun, dest: Path) -> tuple[Path, str]:
    """A copy of the sweep (its report left out) and the tag of its 2-rank job."""
    shutil.copytree(sweep.sweep_dir, dest)
    (dest / "report.html").unlink()
    return dest, next(p.name for p in sweep.job_dirs() if "_ws2_" in p.name)


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))  # Python's json writes inf as Infinity, as a hand edit would


def _case(record: dict[str, Any]) -> dict[str, Any]:
    return record["results"]["cases"][0]


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "infinity_sample": (lambda m: _edit(m, lambda r: _case(r)["times_s"].__setitem__(0, float("inf"))),
                        "its results.cases[0].times_s[0] is inf, not a finite number"),
    "nan_median": (lambda m: _edit(m, lambda r: _case(r).__setitem__("median_s", float("nan"))),
                   "its results.cases[0].median_s is nan, not a finite number"),
    "time_a_string": (lambda m: _edit(m, lambda r: _case(r).__setitem__("times_s", "fast")),
                      "its results.cases[0].times_s is \"fast\", not a number"),
    "world_size_a_string": (lambda m: _edit(m, lambda r: r.__setitem__("world_size", "two")),
                            "its field 'world_size' is \"two\", not a int"),
    "results_a_string": (lambda m: _edit(m, lambda r: r.__setitem__("results", "oops")),
                         "its field 'results' is \"oops\", not a dict"),
    "cases_not_a_list": (lambda m: _edit(m, lambda r: r["results"].__setitem__("cases", {"a": 1})),
                         "its results.cases is not a list of cases"),
    "status_a_number": (lambda m: _edit(m, lambda r: r.__setitem__("status", 3)), "its field 'status' is 3"),
    "a_list": (lambda m: m.write_text("[1, 2]"), "a JSON list, not a job record"),
    "a_directory": (lambda m: (m.unlink(), m.mkdir()), "not a regular file"),
    "a_fifo": (lambda m: (m.unlink(), os.mkfifo(m)), "not a regular file"),  # reading it would wait forever
    "binary": (lambda m: m.write_bytes(os.urandom(2048)), "cannot be read: "),
    "deep_nesting": (lambda m: m.write_text("[" * 200_000 + "]" * 200_000), "maximum recursion depth exceeded"),
}


def _page_text(page: Path) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text())))


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_record_is_one_unreadable_job_and_the_rest_is_reported(sweep: SweepRun, tmp_path: Path,
                                                                           kind: str) -> None:
    damaged, tag = _copy(sweep, tmp_path / "damaged")
    damage, says = DAMAGE[kind]
    damage(damaged / tag / "metrics.json")
    proc = sweepbench_cli("report", damaged)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    text = _page_text(damaged / "report.html")
    assert "1 of 2 jobs ok" in text and f"{tag} {UNREADABLE}" in text and says in text, text[:3000]
    proc = sweepbench_cli("compare", sweep.sweep_dir, damaged, "-o", tmp_path / "cmp")
    _no_traceback(proc)
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith(UNREADABLE))
    assert tag in line and str(damaged / tag / "metrics.json") in line and says in line, proc.stdout


@pytest.mark.timeout(120)
def test_an_env_json_that_is_a_fifo_is_passed_over(sweep: SweepRun, tmp_path: Path) -> None:
    """Reading a FIFO waits for a writer that never comes: a report used to hang on one."""
    damaged, tag = _copy(sweep, tmp_path / "damaged")
    (damaged / tag / "env.json").unlink()
    os.mkfifo(damaged / tag / "env.json")
    assert tag not in load_sweep(damaged).envs
    proc = sweepbench_cli("report", damaged)
    assert proc.returncode == 0 and "2 of 2 jobs ok" in _page_text(damaged / "report.html"), proc.stderr


def test_a_tag_directory_that_cannot_be_read_is_named(sweep: SweepRun, tmp_path: Path) -> None:
    """Mode 000, read by a process without the capability to ignore it (as root: its bounding set
    lacks CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), through the console entry."""
    damaged, tag = _copy(sweep, tmp_path / "damaged")
    (damaged / tag).chmod(0)
    try:
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        proc = subprocess.run([*drop, sys.executable, "-m", "sweepbench", "report", str(damaged), "-o",
                               str(tmp_path / "page.html")], capture_output=True, text=True, timeout=120)
        _no_traceback(proc)
        assert proc.returncode == 0, proc.stderr
        text = _page_text(tmp_path / "page.html")
        assert "1 of 2 jobs ok" in text and f"{tag} {UNREADABLE}" in text and "Permission denied" in text, text[:3000]
    finally:
        (damaged / tag).chmod(0o755)


@pytest.mark.parametrize("csv", ["renamed_tag_header", "empty", "binary"])
def test_a_results_csv_that_cannot_be_read_gives_way_to_the_metrics_files(sweep: SweepRun, tmp_path: Path,
                                                                          csv: str) -> None:
    damaged, _ = _copy(sweep, tmp_path / "damaged")
    path = damaged / "results.csv"
    {"renamed_tag_header": lambda: path.write_text(path.read_text().replace("tag,", "label,", 1)),
     "empty": lambda: path.write_text(""),
     "binary": lambda: path.write_bytes(b"\xe8\x00\xff" + os.urandom(2048))}[csv]()
    proc = sweepbench_cli("report", damaged)
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert f"sweepbench: {path} cannot be read (" in proc.stderr
    assert "the jobs are read from their metrics.json files" in proc.stderr
    assert "2 of 2 jobs ok" in _page_text(damaged / "report.html")
    proc = sweepbench_cli("compare", sweep.sweep_dir, damaged, "-o", tmp_path / "cmp")
    _no_traceback(proc)
    assert proc.returncode == 0 and "1 cases" in proc.stdout and "0 jobs without a twin" in proc.stdout, proc.stdout


def test_a_results_csv_row_that_says_ok_without_a_record_is_failed(sweep: SweepRun, tmp_path: Path) -> None:
    """A row of results.csv stands for a job that left no directory (it never started): one that
    says ok has lost its record, and is not counted ok."""
    damaged, _ = _copy(sweep, tmp_path / "damaged")
    with open(damaged / "results.csv", "a") as f:
        f.write("ghost-job,ok,,collective\n")
    ghost = next(j for j in load_sweep(damaged).jobs if j["tag"] == "ghost-job")
    assert ghost["status"] == "failed"
    assert ghost["error"] == f"results.csv lists it ok, but {damaged / 'ghost-job' / 'metrics.json'} is missing"
    proc = sweepbench_cli("report", damaged)
    assert proc.returncode == 0 and "2 of 3 jobs ok" in _page_text(damaged / "report.html"), proc.stderr


def _jobs_file(sweep: SweepRun, tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    out = tmp_path / "jobs.json"
    assert sweepbench_cli("report", sweep.sweep_dir, "--save-jobs", out, "-o", tmp_path / "p.html").returncode == 0
    _edit(out, change)
    return out


@pytest.mark.parametrize("body", ["a_string", "empty_list", "objects_of_nothing"])
def test_a_jobs_file_with_the_marker_and_a_garbled_body_is_one_line(sweep: SweepRun, tmp_path: Path,
                                                                    body: str) -> None:
    garbled = {"a_string": "garbled", "empty_list": [], "objects_of_nothing": [1, "x", None]}[body]
    path = _jobs_file(sweep, tmp_path, lambda d: d.__setitem__("jobs", garbled))
    for args in (["report", path, "-o", tmp_path / "r.html"], ["compare", sweep.sweep_dir, path, "-o", tmp_path]):
        proc = sweepbench_cli(*args)
        _no_traceback(proc)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and str(path) in lines[0], proc.stderr


def test_a_garbled_record_of_a_jobs_file_is_one_unreadable_job(sweep: SweepRun, tmp_path: Path) -> None:
    def garble(data: dict[str, Any]) -> None:
        data["jobs"][1]["results"] = {"cases": "x"}
        data["envs"], data["command"] = [1], 5

    path = _jobs_file(sweep, tmp_path, garble)
    loaded = load_sweep(path)
    tag = loaded.jobs[1]["tag"]
    assert [j["status"] for j in loaded.jobs] == ["ok", UNREADABLE] and loaded.envs == {} and loaded.command == "5"
    assert loaded.jobs[1]["error"] == f"{path} cannot be read: {tag}: its results.cases is not a list of cases"
    proc = sweepbench_cli("report", path, "-o", tmp_path / "r.html")
    _no_traceback(proc)
    assert proc.returncode == 0 and "1 of 2 jobs ok" in _page_text(tmp_path / "r.html")


def test_a_huge_record_is_thinned_for_the_page_and_the_statistics(sweep: SweepRun, tmp_path: Path) -> None:
    """200,000 samples in one case (5 MB of metrics.json): the statistics and the page see
    MAX_SAMPLES of them, evenly spaced in the order they were taken; the page is the size of one
    made from a record of MAX_SAMPLES samples."""
    damaged, tag = _copy(sweep, tmp_path / "huge")
    many = [1e-3 + i * 1e-9 for i in range(200_000)]
    _edit(damaged / tag / "metrics.json", lambda r: _case(r).__setitem__("times_s", many))
    case = next(j for j in load_sweep(damaged).jobs if j["tag"] == tag)["results"]["cases"][0]
    assert len(case["times_s"]) == MAX_SAMPLES and case["samples_recorded"] == 200_000
    assert case["times_s"] == sorted(case["times_s"]) and case["times_s"][0] == many[0]
    assert case["times_s"][-1] == many[200_000 - 100]
    thinned, _ = _copy(sweep, tmp_path / "thinned")
    _edit(thinned / tag / "metrics.json", lambda r: _case(r).__setitem__("times_s", many[::100]))
    for where in (damaged, thinned):
        proc = sweepbench_cli("report", where)
        assert proc.returncode == 0, proc.stderr
    huge, small = ((where / "report.html").stat().st_size for where in (damaged, thinned))
    assert abs(huge - small) < 0.05 * small, (huge, small)
    proc = sweepbench_cli("compare", sweep.sweep_dir, damaged, "-o", tmp_path / "cmp")
    _no_traceback(proc)
    assert proc.returncode == 0 and "1 cases" in proc.stdout and "0 jobs without a twin" in proc.stdout, proc.stdout
