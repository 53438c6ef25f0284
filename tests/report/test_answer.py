"""The sweep's answer on real CPU sweeps whose answer is known: the page's "fastest" section and
the terminal's ranking name the winner and call the gap real; figures are keyed by what the sweep
varied (seq_len on x, a line per impl; no facet for a single varied axis); no two labels of a
figure overlap in Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sweepbench.report.answer import answer_jobs
from sweepbench.report.axes import layout
from sweepbench.report.load import load_sweep
from sweepbench.report.page import headline_hooks
from sweepbench.report.varied import axis_figures

from ..conftest import SweepRun
from .answer_sweeps import TERMINAL_COLUMNS
from .browser import PageVisit, visit
from .conftest import COMPARE_ROUNDS


@pytest.fixture(scope="module")
def pages(answer_sweeps: dict[str, SweepRun]) -> dict[str, PageVisit]:
    """Each sweep's own end-of-sweep report.html, loaded in Chromium."""
    return {name: visit(run.sweep_dir / "report.html") for name, run in answer_sweeps.items()}


def _jobs(run: SweepRun) -> list[dict]:
    return load_sweep(run.sweep_dir).jobs


def test_fastest_names_the_winner_and_a_real_gap(answer_sweeps: dict[str, SweepRun],
                                                 pages: dict[str, PageVisit]) -> None:
    run = answer_sweeps["slow"]
    (answer,) = answer_jobs(_jobs(run))
    (ranking,) = answer.rankings  # one varied axis, nothing else: one group
    winner, runner = ranking.entries
    assert winner.job["config"]["fault"]["factor"] == 1 and runner.job["config"]["fault"]["factor"] == 4
    assert (winner.label, runner.label) == ("fault.factor=1", "fault.factor=4")
    assert ranking.verdict.verdict == "slower" and ranking.verdict.p_value < 0.002
    # 4x injected, measured against a twin in another process, whose base iteration differs from
    # this one's by up to 1.7x either way on a 2-core box: 16 such sweeps measured 2.56x to 5.91x,
    # and two clean-clone CIs 2.33x and 6.66x.
    # The bounds keep room beyond that and still tell the slowdown applied once from none (1x) or
    # twice (16x); that the gap is real is the verdict's to say (above)
    ratio = runner.median_s / winner.median_s
    assert 1.6 < ratio < 10
    text = pages["slow"].text
    # the answer comes first, before the sweep's metadata and results table
    assert text.index("Fastest") < text.index("git commit") < text.index("Results (")
    shown = re.search(r"fault\.factor=1\t[\d.]+ [µm]s\tfault\.factor=4\t[\d.]+ [µm]s\t(\d\.\d\d)x\treal\t< 0\.002", text)
    assert shown, text[:1500]
    assert float(shown.group(1)) == round(ratio, 2)  # the page shows the gap measured


def test_terminal_ranking_fits_80_columns(answer_sweeps: dict[str, SweepRun]) -> None:
    out = answer_sweeps["slow"].stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("fastest refit"))
    end = next(i for i in range(start, len(out)) if out[i].startswith("└"))
    block = out[start:end + 1]
    assert all(len(line) <= TERMINAL_COLUMNS for line in block), "\n".join(block)
    rows = "\n".join(block)
    assert "fault.factor=1" in rows and "fault.factor=4" in rows and "slower" in rows
    tags = [p.name for p in answer_sweeps["slow"].job_dirs() if (p / "metrics.json").exists()]
    assert not any(tag in rows for tag in tags)  # named by what varied, not by the long tag


def test_seq_len_on_x_one_series_per_impl(answer_sweeps: dict[str, SweepRun],
                                          pages: dict[str, PageVisit]) -> None:
    jobs = _jobs(answer_sweeps["attention"])
    lay = layout(jobs)
    assert lay.x is not None and lay.x.name == "seq_len" and lay.facets == []
    assert [a.name for a in lay.series] == ["impl"]  # cp2, the model, the backend: constant, no axis
    title, fig, _ = axis_figures(jobs, headline_hooks)[0]
    assert title == "fwd+bwd ms vs seq_len"
    (ax,) = [a for a in fig.axes if a.get_visible()]  # one panel: no facet
    assert ax.get_xlabel() == "seq_len"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"ring", "ulysses"}
    for impl, line in lines.items():
        mine = sorted((j["config"]["benchmark"]["seq_len"], j["results"]["summary"]["total_median_ms"])
                      for j in jobs if j["config"]["benchmark"]["impl"] == impl)
        assert list(line.get_xdata()) == [s for s, _ in mine]
        assert list(line.get_ydata()) == pytest.approx([t for _, t in mine])
    assert "fwd+bwd ms vs seq_len" in [f["title"] for f in pages["attention"].figures]
    # the ranking: per seq_len, both impls
    (answer,) = answer_jobs(jobs)
    assert [r.group for r in answer.rankings] == ["seq_len=64", "seq_len=128"]
    assert all({e.label for e in r.entries} == {"ring", "ulysses"} for r in answer.rankings)


def test_one_varied_axis_gets_no_facets(answer_sweeps: dict[str, SweepRun]) -> None:
    jobs = _jobs(answer_sweeps["slow"])
    lay = layout(jobs)
    assert lay.x is None and lay.facets == [] and [a.name for a in lay.series] == ["fault.factor"]
    figs = axis_figures(jobs, headline_hooks)
    assert figs and all(len(fig.axes) == 1 for _, fig, _ in figs)
    bars = figs[0][1].axes[0].patches
    assert len(bars) == 2  # one bar per value of the axis
    assert axis_figures(_jobs(answer_sweeps["train"]), headline_hooks) == []  # one job: nothing varied


def test_no_label_overlaps_on_any_page(pages: dict[str, PageVisit]) -> None:
    for name, seen in pages.items():
        assert seen.console_errors == [], name
        assert seen.texts > 20, name  # the check saw the figures' labels
        assert seen.overlaps == [], (name, seen.overlaps)


@pytest.mark.parametrize("fast_ms, slow_ms", [(0.28, 6.0), (0.011, 40.0), (0.002, 3000.0)])
def test_log_axes_label_plain_numbers_that_never_overlap(tmp_path: Path, fast_ms: float, slow_ms: float) -> None:
    """A strip plot whose medians span more than 20x goes to a log axis. matplotlib's own labels
    on an axis of a decade or two name minor ticks in scientific notation (3x10^-1, 4x10^-1),
    written over each other: a full report run once drew exactly that. The report's log axes name
    plain numbers, at 1-2-5 steps over a few decades and at powers of ten over more."""
    from sweepbench.draw.plotting import figure_svg, strip_plot

    spread = [0.9, 0.95, 1.0, 1.05, 1.2]
    fig = strip_plot({"fast job": [fast_ms * f / 1e3 for f in spread], "slow job": [slow_ms * f / 1e3 for f in spread],
                      "middle job": [(fast_ms * slow_ms) ** 0.5 * f / 1e3 for f in spread]})
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    page = tmp_path / "log.html"
    page.write_text(f"<html><body><figure data-title='log'>{figure_svg(fig, prefix='f')}</figure></body></html>")
    seen = visit(page)
    assert seen.overlaps == [], seen.overlaps
    fig.canvas.draw()
    shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
    assert len(shown) >= 2 and all(re.fullmatch(r"[\d.]+(e[+-]\d+)?", t) for t in shown), shown
    assert not [t for t in ax.get_xminorticklabels() if t.get_text()]


def test_overlap_check_sees_overlapping_labels(tmp_path: Path) -> None:
    """The check above can fail: a figure with two labels written over each other is caught."""
    from sweepbench.draw.plotting import figure_svg, new_figure

    fig = new_figure(3, 2)
    ax = fig.add_subplot()
    ax.set_xticks([0, 0.02], ["a long tick label", "another long label"])
    page = tmp_path / "bad.html"
    page.write_text(f"<html><body><figure data-title='bad'>{figure_svg(fig, prefix='f')}</figure></body></html>")
    seen = visit(page)
    assert {("a long tick label", "another long label")} <= {(o["a"], o["b"]) for o in seen.overlaps}


def test_fastest_judges_on_rounds_where_the_sweep_ran_them(compare_sweeps: dict[str, SweepRun]) -> None:
    """Jobs run as rounds (sweep.repeats=COMPARE_ROUNDS): the answer's gap is compare's verdict on the rounds
    (the same rule `sweepbench compare` uses), not on one process's samples."""
    jobs = [*_jobs(compare_sweeps["base"]), *_jobs(compare_sweeps["slow"])]
    (answer,) = answer_jobs(jobs)
    (ranking,) = answer.rankings
    winner, runner = ranking.entries
    assert winner.job["config"]["fault"]["kind"] == "none" and runner.job["config"]["fault"]["kind"] == "slow"
    assert ranking.verdict.basis == "rounds" and ranking.verdict.n_baseline == COMPARE_ROUNDS == ranking.verdict.n_candidate
    assert ranking.verdict.verdict == "slower", ranking.sentence()
    assert "slower, p < 0.01" in ranking.sentence()
