"""The HTML report of real CPU sweeps of every benchmark, loaded in real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import SweepRun, base_env
from .browser import PageVisit, png_is_not_blank, visit
from .conftest import sweepbench_cli

# per-benchmark figures, from each plugin's plots() hook (titles as the plugins name them)
HOOK_FIGURES = {"collective": "busbw", "refit": "refit time", "reshard": "reshard"}


@pytest.fixture(scope="module")
def page(report_sweeps: dict[str, SweepRun], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PageVisit]:
    out = tmp_path_factory.mktemp("page") / "all.html"
    # the console entry as a user types it: `python -m sweepbench report ...` (not Hydra's main)
    proc = subprocess.run([sys.executable, "-m", "sweepbench", "report",
                           *(str(r.sweep_dir) for r in report_sweeps.values()), "-o", str(out)],
                          env=base_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert f"report written to {out}" in proc.stdout
    return out, visit(out)


def test_every_sweep_ends_with_its_report(report_sweeps: dict[str, SweepRun]) -> None:
    for name, run in report_sweeps.items():
        report = run.sweep_dir / "report.html"
        assert report.is_file(), f"{name}: no report.html\n{run.describe()}"
        assert f"sweepbench: report {report}" in run.stdout
        text = report.read_text()
        for job in run.job_dirs():
            assert job.name in text


def test_page_loads_without_errors_or_requests(page: tuple[Path, PageVisit]) -> None:
    path, seen = page
    assert seen.console_errors == []
    assert seen.requests[0] == path.resolve().as_uri()  # the page itself
    assert all(u.startswith(("file:", "data:")) for u in seen.requests), seen.requests
    # nothing in the file could fetch anything either (SVG namespaces are names, not requests)
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//)""", path.read_text())
    assert "<script" not in path.read_text()


def test_every_figure_renders(page: tuple[Path, PageVisit]) -> None:
    _, seen = page
    assert seen.figures, "no figure in the page"
    for fig in seen.figures:
        assert fig["width"] > 100 and fig["height"] > 100, fig
        assert fig["drawn"] > 20, fig  # axes, ticks, lines: a figure, not an empty box


def test_screenshot_is_not_blank(page: tuple[Path, PageVisit], tmp_path: Path) -> None:
    _, seen = page
    width, height, colours = png_is_not_blank(seen.screenshot)
    (tmp_path / "report.png").write_bytes(seen.screenshot)
    assert width == 1400 and height > 1000
    assert colours > 50  # text, lines, status colours: not a blank or single-colour page


def test_page_holds_every_sweep_job_and_failure(report_sweeps: dict[str, SweepRun],
                                                page: tuple[Path, PageVisit]) -> None:
    _, seen = page
    for name, run in report_sweeps.items():
        assert f"Sweep {run.sweep_dir.name}" in seen.text
        command = json.dumps(run.args)  # the sweep's command, as multirun.yaml recorded it
        assert "benchmark=" + name in seen.text, command
        for tag, metrics in run.all_metrics().items():
            assert tag in seen.text
            if metrics["status"] != "ok":
                assert metrics["error"] and metrics["error"][:60] in seen.text
    failed = [m for r in report_sweeps.values() for m in r.all_metrics().values() if m["status"] != "ok"]
    assert len(failed) == 1 and "injected fault" in failed[0]["error"]
    assert "Failed jobs" in seen.text
    assert "git commit" in seen.text and "CPUs" in seen.text and "GPUs" in seen.text


def test_headline_columns_and_hook_figures(report_sweeps: dict[str, SweepRun], page: tuple[Path, PageVisit]) -> None:
    _, seen = page
    assert "busbw GB/s @16 KiB" in seen.text  # collective's headline label, with its unit and size
    titles = [f["title"] for f in seen.figures]
    for bench, title in HOOK_FIGURES.items():
        assert any(title in t for t in titles), (bench, titles)
        # one per-iteration figure per benchmark, every job side by side (not one chart per job)
        assert titles.count(f"{bench}: per-iteration times") == 1, titles
    ok = [tag for r in report_sweeps.values() for tag, m in r.all_metrics().items() if m["status"] == "ok"]
    assert not set(ok) & set(titles)


def test_fastest_section_lists_failed_jobs(page: tuple[Path, PageVisit]) -> None:
    """The collective sweep varied fault.kind (none, raise): the failed job is in the answer, by
    the axis that varied, with its error, never dropped."""
    _, seen = page
    fastest = seen.text[seen.text.index("Fastest"):seen.text.index("git commit")]
    assert "collective (varied: fault.kind)" in fastest
    assert "Failed (1):" in fastest and "fault.kind=raise failed" in fastest and "injected fault" in fastest


def test_no_label_overlaps(page: tuple[Path, PageVisit]) -> None:
    _, seen = page
    assert seen.texts > 5 * len(seen.figures)  # the check saw the labels of every figure
    assert seen.overlaps == [], seen.overlaps


def test_save_jobs_round_trip(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    refit = report_sweeps["refit"]
    ref = tmp_path / "ref.json"
    proc = sweepbench_cli("report", refit.sweep_dir, "-o", tmp_path / "r.html", "--save-jobs", ref)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(ref.read_text())
    assert {j["tag"] for j in data["jobs"]} == set(refit.all_metrics())
    # a jobs file renders like the sweep it came from
    proc = sweepbench_cli("report", ref, "-o", tmp_path / "from_file.html")
    assert proc.returncode == 0, proc.stderr
    assert all(tag in (tmp_path / "from_file.html").read_text() for tag in refit.all_metrics())


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = sweepbench_cli("report", tmp_path / "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"sweepbench: error: {tmp_path / 'nope'} is neither a sweep directory nor a jobs file (.json)"
    (tmp_path / "empty").mkdir()
    proc = sweepbench_cli("report", tmp_path / "empty")
    assert proc.returncode == 2 and "holds no job" in proc.stderr


def _one_line_exit_2(proc: subprocess.CompletedProcess, *names: str) -> None:
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sweepbench: error: ") and all(n in line for n in names), line


def test_report_to_a_path_it_cannot_write(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    sweep = report_sweeps["refit"].sweep_dir
    _one_line_exit_2(sweepbench_cli("report", sweep, "-o", "/proc/report.html"), "/proc/report.html")
    _one_line_exit_2(sweepbench_cli("report", sweep, "-o", tmp_path), str(tmp_path), "is a directory")
    (tmp_path / "file").write_text("x")
    _one_line_exit_2(sweepbench_cli("report", sweep, "-o", tmp_path / "file" / "r.html"), "r.html", "not a directory")
    _one_line_exit_2(sweepbench_cli("report", sweep, "-o", tmp_path / "r.html", "--save-jobs", "/proc/jobs.json"),
                     "/proc/jobs.json")
    assert not (tmp_path / "r.html").exists()  # checked before anything was written
    _one_line_exit_2(sweepbench_cli("compare", sweep, sweep, "-o", "/proc/out"), "/proc/out")


def _truncated_copy(sweep: Path, dest: Path, *, jobs: int | None = None) -> list[str]:
    """A copy of ``sweep`` whose first ``jobs`` (all) metrics.json files are cut in half."""
    shutil.copytree(sweep, dest, ignore=shutil.ignore_patterns("wandb", "compare.*"))
    cut = sorted(dest.glob("*/metrics.json"))[:jobs]
    for path in cut:
        path.write_text(path.read_text()[:200])
    return [p.parent.name for p in cut]


def test_compare_with_unreadable_records(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    good = report_sweeps["refit"].sweep_dir
    broken = tmp_path / "broken"
    (tag,) = _truncated_copy(good, broken)
    proc = sweepbench_cli("compare", good, broken, "--fail-on-regression")
    _one_line_exit_2(proc, str(broken / tag / "metrics.json"), "cannot be read")
    assert not list(broken.glob("compare.*"))  # nothing written into the broken sweep


def test_an_unreadable_job_is_named_and_fails_the_gate(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    good = report_sweeps["collective"].sweep_dir  # two jobs: fault.kind=none (ok) and raise (failed)
    half = tmp_path / "half"
    (tag,) = _truncated_copy(good, half, jobs=1)
    proc = sweepbench_cli("compare", good, half, "--on", "fault.kind")
    assert proc.returncode == 0, proc.stderr  # without the gate: reported, not an error
    assert re.search(rf"unreadable\s+{tag}\s+{re.escape(str(half / tag / 'metrics.json'))} cannot be read", proc.stdout)
    assert "1 jobs unreadable" in proc.stdout
    proc = sweepbench_cli("compare", good, half, "--on", "fault.kind", "--fail-on-regression")
    # the gate fails closed on what it could not judge: its own exit code, a line naming the job
    assert proc.returncode == 3, proc.stderr
    assert re.search(rf"not judged: {tag} unreadable: .* cannot be read", proc.stderr), proc.stderr
    # the report lists it among the failed jobs, by name
    assert sweepbench_cli("report", half, "-o", tmp_path / "r.html").returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert tag in page and "unreadable" in page and "cannot be read" in page


def test_browser_check_catches_a_bad_page(tmp_path: Path) -> None:
    """The checks above can fail: a page with a console error and an outside request is seen."""
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script>'
                   "<figure><svg width='0' height='0'></svg></figure></body></html>")
    seen = visit(bad)
    assert "http://127.0.0.1:9/x.png" in seen.requests
    assert any("boom" in e for e in seen.console_errors)
    assert seen.figures == [{"title": "", "width": 0, "height": 0, "drawn": 0}]
