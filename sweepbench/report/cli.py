"""The ``report`` and ``compare`` sub-commands of ``sweepbench`` / ``python -m sweepbench``.

``maybe_run(argv)`` is called first thing by the main entry point: when the first argument is a
sub-command it runs it and returns True; otherwise the arguments are Hydra's (``key=value``,
``-m``) and it returns False without importing anything heavy."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

COMMANDS = ("report", "compare")


def _parser() -> argparse.ArgumentParser:
    from sweepbench.report.verdicts import Thresholds

    d = Thresholds()
    parser = argparse.ArgumentParser(
        prog="sweepbench",
        description="Reports and comparisons of sweeps "
        "(any other arguments are Hydra overrides: sweepbench -m key=a,b).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    rep = sub.add_parser("report", help="write the HTML report of one or more sweeps")
    rep.add_argument("sweeps", nargs="+", type=Path, help="sweep directories (or jobs files)")
    rep.add_argument("-o", "--out", type=Path, help="the HTML file (default: <first sweep>/report.html)")
    rep.add_argument(
        "--save-jobs",
        type=Path,
        metavar="FILE",
        help="also write the first sweep's job records to one JSON file (a reference to compare against)",
    )
    rep.add_argument(
        "--wandb",
        action="store_true",
        help="publish a saved wandb workspace view of the sweep (needs `wandb login` and "
        "the runs synced; pip install 'sweepbench[workspaces]')",
    )
    rep.add_argument("--baseline", help="with --wandb: the run name (tag) to pin as the baseline")

    cmp = sub.add_parser("compare", help="per job and case: faster / slower / unchanged / unstable")
    cmp.add_argument("baseline", type=Path, help="a sweep directory or a jobs file")
    cmp.add_argument("candidate", type=Path, help="a sweep directory or a jobs file")
    cmp.add_argument(
        "--on",
        help="join jobs by these config columns (comma-separated, e.g. "
        "parallelism,benchmark.strategy) instead of their whole config",
    )
    cmp.add_argument(
        "-o",
        "--out",
        type=Path,
        help="folder for compare.csv and compare.html (default: the candidate sweep's directory)",
    )
    cmp.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a case is slower (or a candidate job failed where the baseline's was ok), "
        "3 when a job or case could not be judged, 4 when no case was decided",
    )
    cmp.add_argument(
        "--min-change", type=float, default=d.min_change, help=f"smallest change reported (default {d.min_change})"
    )
    cmp.add_argument(
        "--noise-factor",
        type=float,
        default=d.noise_factor,
        help=f"x the baseline's robust noise, IQR/(1.349 median), in the threshold (default {d.noise_factor})",
    )
    cmp.add_argument("--p-value", type=float, default=d.p_value, help=f"Mann-Whitney U level (default {d.p_value})")
    cmp.add_argument(
        "--max-cv", type=float, default=d.max_cv, help=f"CV above which a side is unstable (default {d.max_cv})"
    )
    cmp.add_argument(
        "--max-spread",
        type=float,
        default=d.max_spread,
        help=f"max/median above which a side is unstable (default {d.max_spread})",
    )
    return parser


def check_writable(path: Path, *, what: str, folder: bool = False) -> None:
    """Raise ValueError (one line naming ``path``) unless ``path`` (a file, or with ``folder`` a
    directory) can be written: checked before anything is read or rendered, so that a bad
    ``-o`` leaves nothing half-written."""
    if path.is_dir() != folder and path.exists():
        kind = "a directory" if path.is_dir() else "a file"
        raise ValueError(f"{what} {path} is {kind}; name {'a directory' if folder else 'a file'} instead")
    existing = path if folder else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what} {path}: {existing} is not a directory")
    try:  # os.access says yes to root on read-only or virtual file systems (/proc): try for real
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be written: {existing}: {err.strerror or err}") from None
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{what} {path} cannot be written: {existing} is not writable")


def _report(args: argparse.Namespace) -> int:
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep, save_jobs_file
    from sweepbench.report.page import REPORT_FILE, write_report

    check_writable(args.out or args.sweeps[0] / REPORT_FILE, what="report file")
    if args.save_jobs:
        check_writable(args.save_jobs, what="--save-jobs file")
    sweeps = [load_sweep(p) for p in args.sweeps]  # each read once, for the page, --save-jobs and --wandb
    answers = [answer_jobs(s.jobs) for s in sweeps]  # each ranked once, for the page and --wandb
    out = write_report(args.sweeps, args.out, sweeps=sweeps, answers=answers)
    print(f"sweepbench: report written to {out}")
    if args.save_jobs:
        print(f"sweepbench: job records written to {save_jobs_file(sweeps[0], args.save_jobs)}")
    if args.wandb:
        from sweepbench.report.workspace import publish_workspace

        return publish_workspace(sweeps[0], baseline=args.baseline, answers=answers[0])
    return 0


def _compare(args: argparse.Namespace) -> int:
    from sweepbench.report.compare import compare_sweeps, write_comparison
    from sweepbench.report.load import UNREADABLE, load_sweep
    from sweepbench.report.verdicts import Thresholds

    thresholds = Thresholds(
        min_change=args.min_change,
        noise_factor=args.noise_factor,
        p_value=args.p_value,
        max_cv=args.max_cv,
        max_spread=args.max_spread,
    )
    out_dir = args.out or (args.candidate if args.candidate.is_dir() else Path.cwd())
    check_writable(out_dir, what="compare output directory", folder=True)
    baseline, candidate = load_sweep(args.baseline), load_sweep(args.candidate)
    # a job whose records cannot be read has no config to join on: it is named here and fails the gate
    unreadable = [j for sweep in (baseline, candidate) for j in sweep.jobs if j.get("status") == UNREADABLE]
    baseline, candidate = (
        replace(s, jobs=[j for j in s.jobs if j.get("status") != UNREADABLE]) for s in (baseline, candidate)
    )
    on = [c.strip() for c in args.on.split(",") if c.strip()] if args.on else None
    comparison = compare_sweeps(baseline, candidate, on=on, thresholds=thresholds)
    csv_path, html_path = write_comparison(comparison, baseline, candidate, thresholds, out_dir)
    for job in unreadable:
        print(f"{UNREADABLE:>12}  {job['tag']}  {job['error']}")
    for row in comparison.rows:  # an unchanged case only where its ratio is beyond min_change: the noise decided it
        if row["verdict"] != "unchanged" or _beyond(row.get("ratio"), 1 + thresholds.min_change):
            print(f"{row['verdict']:>12}  {row['candidate_tag']}  {row['case']}  {_row_numbers(row)}")
    counts = ", ".join(f"{v}: {n}" for v, n in comparison.counts())
    print(
        f"sweepbench compare: {len(comparison.rows)} cases ({counts or 'none'}); "
        f"{len(comparison.unmatched)} jobs without a twin"
        + (f"; {len(unreadable)} jobs unreadable" if unreadable else "")
        + f"\n  {csv_path}\n  {html_path}"
    )
    for note in comparison.notes():
        print(f"  note: {note}")
    if not args.fail_on_regression:
        return 0
    return _gate(comparison, [f"{job['tag']} {UNREADABLE}: {job['error']}" for job in unreadable])


# --fail-on-regression's exit codes besides 0 (pass) and 2 (bad input): the gate fails closed
REGRESSION, UNJUDGED, UNDECIDED = 1, 3, 4


def _beyond(ratio: float | None, limit: float) -> bool:
    return ratio is not None and max(ratio, 1 / ratio) > limit


def _row_numbers(row: dict[str, Any]) -> str:
    """A row's ratio, interval, p (q), threshold and noise, then its note (why it did not decide)."""
    if row.get("ratio") is None:
        return row.get("note") or ""
    text = f"{row['ratio']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] p={row['p_value']:.2g}" + (
        f" q={row['q_value']:.2g}" if row.get("q_value") is not None else ""
    )
    if row["verdict"] in ("slower", "faster", "unchanged"):  # the others' note opens with their threshold and noise
        noise = "between rounds" if row.get("basis") == "rounds" else f"baseline CV {row['baseline_cv']:.2f}"
        return text + f" threshold {row['threshold']:.3f} (noise {row['baseline_noise']:.3f}, {noise})"
    return text + (f": {row['note']}" if row.get("note") else "")


def _gate(comparison: Any, unreadable: list[str]) -> int:
    """``--fail-on-regression``: 1 when a case is slower or a candidate job failed where its
    baseline's was ok; 3 when a job could not be judged (each named); 4 when no case was decided
    (the line says what would decide); else 0."""
    regressions = comparison.regressions
    unjudged = [*unreadable, *comparison.unjudged]
    for line in unjudged:
        print(f"sweepbench: not judged: {line}", file=sys.stderr)
    if regressions:
        print(
            f"sweepbench: error: {len(regressions)} regressions"
            + (f", {len(unjudged)} jobs or cases not judged" if unjudged else "")
            + " (--fail-on-regression)",
            file=sys.stderr,
        )
        return REGRESSION
    if unjudged:
        print(
            f"sweepbench: error: {len(unjudged)} jobs or cases not judged, so the gate cannot pass "
            f"(--fail-on-regression)",
            file=sys.stderr,
        )
        return UNJUDGED
    if not comparison.decided():
        print(f"sweepbench: error: undecided: {comparison.what_would_decide()} (--fail-on-regression)", file=sys.stderr)
        return UNDECIDED
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        return _report(args) if args.command == "report" else _compare(args)
    except ValueError as err:  # bad input: one line, exit 2, as everywhere in sweepbench
        print(f"sweepbench: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:  # an output that cannot be written after all (a disk full mid-write): no half file
        print(
            f"sweepbench: error: {err.filename or 'an output'} cannot be written: {err.strerror or err}",
            file=sys.stderr,
        )
        return 2


def maybe_run(argv: Sequence[str] | None = None) -> bool:
    """Run a sub-command (and exit with its status) if ``argv`` (default: the command line's
    arguments) starts with one; else False."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        return False
    sys.exit(main(argv))
