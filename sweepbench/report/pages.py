"""The current results pages: one ``<benchmark>_<machine>.md`` and ``.csv`` per benchmark and
machine, generated from the raw runs under ``docs/results/runs/`` and never edited by hand.

A raw run is a folder ``<benchmark>_<machine>_<YYYY-MM-DD>[_<what>]`` holding ``results.csv`` (one
row per measured case), ``command.txt``, ``env.json`` (torch, CUDA, NCCL, cuDNN, driver, GPU) and,
where several runs on one machine share a day, ``run.json`` with their ``sequence`` (1, 2, ... in
the order they ran; runs of the same name on one day also carry ``_2``, ``_3``); ``notes.md``, if
any, says in a sentence or two what the run found, and the page quotes it. A run whose code was
measured and then not kept (``--not-kept REASON``: ``run.json``'s ``not_kept``) gives a row only
for a case no kept run measured, and is listed with the reason. A folder without
``results.csv`` (a profile, an emulation, a peer's twin) is listed on its benchmark's page for that
machine with its note, and gives no rows; one named for no benchmark is on no page.

One row per case (the benchmark's ``PageSpec.case`` columns): of the runs that measured it, the
page shows the one with the most timed iterations, and of those the latest (runs of kept code
first); never the fastest.
Where another run of the case differs from it by more than the two IQRs together, the row says
so. Within one case group (the case without its implementation), a gap to the fastest smaller than
the two IQRs reads "within noise".

    python bench/pages.py [--root docs/results] [--check]      # or python -m sweepbench.report.pages
    python bench/pages.py --add multirun/SWEEP --name attention_h200x2_2026-11-27_gqa8   # keep a sweep, then regenerate
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweepbench.draw.units import format_number
from sweepbench.record import METRICS_FILE, ROUNDS_DIR
from sweepbench.record.atomic import write_atomic

# how the GPUs ran a job's timed samples (its metrics.json ``gpu_state``), taken into its rows
GPU_STATE = ("gpu_sm_mhz_median", "gpu_power_capped_pct")
RUN_NAME = re.compile(r"^(?P<benchmark>[a-z]+)_(?P<machine>[a-z0-9]+)_(?P<date>\d{4}-\d{2}-\d{2})(?:_(?P<what>.+?))?$")
COMMON = (
    "benchmark",
    "machine",
    "impl",
    "world_size",
    "iters",
    "median_ms",
    "iqr_ms",
    *GPU_STATE,
    "date",
    "torch",
    "cuda",
    "nccl",
    "cudnn",
    "driver",
    "gpu",
    "run",
)
TAIL = ("vs_fastest", "other_runs")
VERSIONS = ("torch", "cuda", "nccl", "cudnn", "driver", "gpu")


@dataclass(frozen=True)
class Run:
    name: str
    benchmark: str
    machine: str
    date: str
    order: tuple[str, int]  # (date, sequence that day): later runs sort after
    rows: list[dict[str, Any]]
    env: dict[str, Any]
    command: str
    notes: str  # notes.md: what the run found, in a sentence or two
    not_kept: str = ""  # why the code this run measured was not kept ("" where it was)


def _meta(d: Path) -> dict[str, Any]:
    return json.loads((d / "run.json").read_text()) if (d / "run.json").is_file() else {}


def load_runs(root: Path) -> list[Run]:
    """Every raw run under ``root/runs`` that has a results.csv and a benchmark name."""
    runs = []
    for d in sorted((root / "runs").iterdir()):
        m = RUN_NAME.match(d.name)
        if not m or not d.is_dir():
            continue
        rows = []
        if (d / "results.csv").is_file():
            with open(d / "results.csv", newline="") as f:
                rows = list(csv.DictReader(f))
            states = {tag: _gpu_state(d / tag) for tag in {row.get("tag") for row in rows} if tag}
            rows = [
                {**row, **{k: v for k, v in states.get(row.get("tag"), {}).items() if row.get(k) in ("", None)}}
                for row in rows
            ]
        env = json.loads((d / "env.json").read_text()) if (d / "env.json").is_file() else {}
        meta = _meta(d)
        text = {n: (d / n).read_text().strip() if (d / n).is_file() else "" for n in ("command.txt", "notes.md")}
        runs.append(
            Run(
                d.name,
                m["benchmark"],
                m["machine"],
                m["date"],
                (m["date"], int(meta.get("sequence", 1))),
                rows,
                env,
                text["command.txt"],
                text["notes.md"],
                str(meta.get("not_kept", "")),
            )
        )
    return runs


def _gpu_state(job_dir: Path) -> dict[str, Any]:
    """A kept job's :data:`GPU_STATE` columns from its metrics.json (``record.recorder.
    gpu_state_columns``): those it recorded; none for a job without the file or the record. Read
    once per job, whatever number of results.csv rows it gave."""
    if not (job_dir / METRICS_FILE).is_file():
        return {}
    from sweepbench.record.recorder import gpu_state_columns

    state = gpu_state_columns(json.loads((job_dir / METRICS_FILE).read_text()))
    return {k: state[k] for k in GPU_STATE if state.get(k) is not None}


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x else None


def _fmt(v: Any) -> str:
    x = _num(v)
    if x is None or isinstance(v, bool) or (isinstance(v, str) and not re.match(r"^-?[\d.]+(e-?\d+)?$", v)):
        return "" if v is None else str(v)
    if x == int(x) and abs(x) >= 1 and "." not in str(v):
        return str(int(x))
    return format_number(x)


def _noise(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    ia, ib = _num(a.get("iqr_ms")), _num(b.get("iqr_ms"))
    return None if ia is None or ib is None else ia + ib


def build_page(benchmark: str, machine: str, runs: list[Run], spec: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows of the page's CSV, the Markdown page) for one benchmark on one machine."""
    pool = []
    for run in sorted(runs, key=lambda r: r.order):
        for row in run.rows:
            if row.get("status", "ok") != "ok" or _num(row.get("median_ms")) is None:
                continue
            pool.append(
                {
                    **row,
                    **{k: v for k, v in spec.absent if row.get(k) in ("", None)},
                    "machine": machine,
                    "date": run.date,
                    "run": run.name,
                    "_order": run.order,
                    "_kept": not run.not_kept,
                    **{k: run.env.get(k, "") for k in VERSIONS},
                }
            )
    cases: dict[tuple, list[dict[str, Any]]] = {}
    for row in pool:
        cases.setdefault(tuple(row.get(k, "") for k in spec.case), []).append(row)
    shown = []
    for key, rows in cases.items():
        candidates = [r for r in rows if r["_kept"]] or rows
        best_iters = max(_num(r.get("iters")) or 0 for r in candidates)
        pick = max((r for r in candidates if (_num(r.get("iters")) or 0) == best_iters), key=lambda r: r["_order"])
        others = []
        for r in rows:
            if r is pick:
                continue
            gap, noise = abs(float(r["median_ms"]) - float(pick["median_ms"])), _noise(r, pick)
            verdict = (
                " (an IQR not recorded)"
                if noise is None
                else " (differs by more than the IQRs)"
                if gap > noise
                else " (within noise)"
            )
            code = "" if r["_kept"] else " (code not kept)"
            others.append(f"{r['run']}: {_fmt(r['median_ms'])} ms at {_fmt(r.get('iters'))} iters{verdict}{code}")
        shown.append({**pick, "other_runs": "; ".join(others)})
    if spec.derive:
        spec.derive(shown, pool)
    group_keys = [k for k in spec.case if k not in ("impl", "strategy", *spec.ways)]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in shown:
        groups.setdefault(tuple(row.get(k, "") for k in group_keys), []).append(row)
    for rows in groups.values():
        fastest = min(rows, key=lambda r: float(r["median_ms"]))
        for r in rows:
            noise = _noise(r, fastest)
            ratio = float(r["median_ms"]) / float(fastest["median_ms"])
            if r is fastest:
                r["vs_fastest"] = "fastest" if len(rows) > 1 else ""
            elif noise is not None and float(r["median_ms"]) - float(fastest["median_ms"]) < noise:
                r["vs_fastest"] = f"{ratio:.3f}x, within noise"
            else:
                r["vs_fastest"] = f"{ratio:.3f}x"
    order = group_keys + [k for k in spec.case if k not in group_keys]
    shown.sort(key=lambda r: tuple(_sort_key(r.get(k, "")) for k in order))
    columns = list(COMMON) + [c for c in spec.columns if c not in COMMON] + list(TAIL)
    out = [{c: r.get(c, "") for c in columns} for r in shown]
    return out, _markdown(benchmark, machine, runs, spec, columns, out)


def _sort_key(v: Any) -> tuple[int, float, str]:
    x = _num(v)
    return (0, x, "") if x is not None else (1, 0.0, str(v))


def _markdown(
    benchmark: str, machine: str, runs: list[Run], spec: Any, columns: list[str], rows: list[dict[str, Any]]
) -> list[str]:
    used = sorted({r["run"] for r in rows})
    lines = [
        f"# {benchmark} on {machine}",
        "",
        "Generated by `python bench/pages.py` from the raw runs in `runs/`; do not edit by hand.",
    ]
    if not rows:
        return (
            lines + [f"No timed {benchmark} case is kept for this machine; what was measured on it:", ""] + _other(runs)
        )
    lines += [
        "The machine-readable table is the CSV beside this page.",
        "",
        "One row per case: of the runs that measured a case, the row shows the one with the most timed",
        "iterations, and of those the latest (not the fastest); `other_runs` lists the rest, marked where",
        "one differs by more than the two IQRs together. `vs_fastest`: time over the fastest of the same",
        'case, "within noise" where the gap is smaller than the two IQRs together.',
        "",
    ]
    if any(r.get(c) not in ("", None) for r in rows for c in GPU_STATE):
        lines[-1:-1] = [
            "`gpu_sm_mhz_median`, `gpu_power_capped_pct`: how the GPUs ran the shown run's timed samples",
            "(its metrics.json `gpu_state`: the lowest rank's median SM clock, the largest share of a rank's",
            "readings at the power cap); empty for a run recorded before jobs kept it.",
        ]
    if any(r.not_kept for r in runs):
        lines[-1:-1] = [
            "A run of code that was measured and then not kept (its reason under Runs) gives a row only where",
            "no run of kept code measured the case.",
        ]
    lines += [f"- {n}" for n in spec.notes] + ([""] if spec.notes else [])
    shown = [
        c
        for c in columns
        if c not in ("benchmark", "machine") + VERSIONS and any(r.get(c) not in ("", None) for r in rows)
    ]
    if rows:
        lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")).replace("|", "/") for c in shown) + " |")
    timed = sorted((r for r in runs if r.rows), key=lambda r: r.order)
    if timed:
        lines += [
            "",
            "## Runs",
            "",
            "Oldest first; a run no row shows was superseded, case by case, by a later or longer one.",
            "",
        ]
    for run in timed:
        env = ", ".join(f"{k} {run.env[k]}" for k in VERSIONS if run.env.get(k) not in ("", None))
        shown_here = "" if run.name in used else "; no row shown"
        lines += [
            f"- `runs/{run.name}/` ({run.date}; {env or 'versions not recorded'}{shown_here}):",
            "",
            *[f"      {c}" for c in run.command.splitlines()],
            "",
        ]
        if run.not_kept:
            lines += [f"  Code not kept: {run.not_kept}", ""]
        if run.notes:
            lines += [f"  {n}" for n in run.notes.splitlines()] + [""]
    other = _other(runs)
    if other:
        lines += [
            "",
            "## Other measurements on this machine",
            "",
            "Kept with their files in `runs/`; they time no case of the table.",
            "",
            *other,
        ]
    return lines


def _other(runs: list[Run]) -> list[str]:
    """The runs without results.csv (profiles, emulations, peers' twins), each with its note."""
    lines = []
    for run in sorted((r for r in runs if not r.rows), key=lambda r: r.order):
        env = ", ".join(f"{k} {run.env[k]}" for k in VERSIONS if run.env.get(k) not in ("", None))
        lines += [f"- `runs/{run.name}/` ({run.date}{'; ' + env if env else ''})" + (":" if run.notes else ""), ""]
        lines += [f"  {n}" for n in run.notes.splitlines()] + ([""] if run.notes else [])
    return lines


def _csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def render_all(root: Path) -> dict[str, str]:
    """{file name under root: its text} of every current page the raw runs make."""
    from sweepbench.benchmarks.registry import benchmark_names, get_benchmark

    runs = load_runs(root)
    names = set(benchmark_names())
    files = {}
    for bench, machine in sorted({(r.benchmark, r.machine) for r in runs if r.benchmark in names}):
        spec = get_benchmark(bench).page()
        if spec is None:
            continue
        mine = [r for r in runs if (r.benchmark, r.machine) == (bench, machine)]
        rows, md = build_page(bench, machine, mine, spec)
        if rows:
            files[f"{bench}_{machine}.csv"] = _csv_text(rows)
        files[f"{bench}_{machine}.md"] = "\n".join(md).rstrip() + "\n"
    return files


def add_run(sweep: Path, root: Path, name: str, *, command: str = "", not_kept: str = "") -> Path:
    """Keep a finished sweep as the raw run ``root/runs/<name>``: results.csv from each job's
    metrics.json through its benchmark's ``PageSpec.rows`` (a failed job as one row with its
    status and error), each job's metrics.json and env.json (its rounds' too, under
    ``<tag>/rounds/<r>/``), command.txt (``command``, else the sweep's recorded overrides),
    env.json (the first job's versions) and run.json (after the runs already kept for that machine
    and day; ``not_kept``, if given: why the code it measured was not kept). A job run in rounds (``sweep.repeats``) gives the rows of its combined record; where
    not all its rounds ended ok, the rows of each round that did, so that what was measured is
    kept. Written beside and renamed in: never half there."""
    from sweepbench.benchmarks.registry import benchmark_names, get_benchmark

    m = RUN_NAME.match(name)
    if not m or m["benchmark"] not in benchmark_names():
        raise ValueError(
            f"run name {name!r}: valid is <benchmark>_<machine>_<YYYY-MM-DD>[_<what>] with a benchmark "
            f"of {sorted(benchmark_names())}, e.g. attention_h200x2_2026-11-27_gqa8"
        )
    dest = root / "runs" / name
    if dest.exists():
        raise ValueError(f"{dest} exists; give the run another name (a repeat the same day: {name}_2)")
    jobs = sorted(p for p in sweep.glob(f"*/{METRICS_FILE}"))  # a job's own record, not its rounds'
    if not jobs:
        raise ValueError(f"{sweep}: no metrics.json under it; valid: a sweep directory whose jobs ran")
    spec = get_benchmark(m["benchmark"]).page()
    if spec is None:
        raise ValueError(f"{m['benchmark']} has no results pages (its Benchmark.page() is None): no raw run to keep")
    rows, env = [], None
    tmp = root / "runs" / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for path in jobs:
        rounds = sorted(path.parent.glob(f"{ROUNDS_DIR}/*/{METRICS_FILE}"), key=lambda p: int(p.parent.name))
        records = []
        for file in [path, *rounds]:
            text = file.read_text()  # read once: parsed for the rows, kept as it is
            record = json.loads(text)
            if record.get("benchmark") != m["benchmark"]:
                raise ValueError(f"{file}: a {record.get('benchmark')} job in a run named for {m['benchmark']}")
            records.append(record)
            kept = tmp / file.parent.relative_to(sweep)
            kept.mkdir(parents=True, exist_ok=True)
            write_atomic(kept / METRICS_FILE, text)
            if (file.parent / "env.json").is_file():
                env_text = (file.parent / "env.json").read_text()
                write_atomic(kept / "env.json", env_text)
                env = env or json.loads(env_text)
        job, ended = records[0], [r for r in records[1:] if r.get("status") == "ok"]
        for record in [job] if job["status"] == "ok" or not ended else ended:
            base = {
                "benchmark": m["benchmark"],
                "status": record["status"],
                "verified": record.get("verified"),
                "tag": job["tag"],
                "error": record.get("error") or "",
            }
            cases = spec.rows(record) if record["status"] == "ok" else []
            rows += [{**r, **base} for r in cases] or [{**base, "world_size": record.get("world_size")}]
    cols = list(dict.fromkeys(k for r in rows for k in ("benchmark", *r)))
    write_atomic(tmp / "results.csv", _csv_text([{c: r.get(c, "") for c in cols} for r in rows]))
    write_atomic(tmp / "command.txt", (command or _command_of(sweep)) + "\n")
    gpus = (env or {}).get("gpus") or {}
    write_atomic(
        tmp / "env.json",
        json.dumps(
            {
                "gpu": (gpus.get("names") or ["cpu"])[0],
                "gpus": gpus.get("count", 0),
                "torch": (env or {}).get("torch", ""),
                "cuda": (env or {}).get("cuda") or "",
                "nccl": (env or {}).get("nccl") or "",
                "cudnn": _cudnn((env or {}).get("cudnn")),
                "driver": gpus.get("driver") or "",
            },
            indent=1,
            sort_keys=True,
        )
        + "\n",
    )
    same_day = [r for r in load_runs(root) if (r.machine, r.date) == (m["machine"], m["date"])]
    meta: dict[str, Any] = {"sequence": max((r.order[1] for r in same_day), default=0) + 1}
    if not_kept:
        meta["not_kept"] = not_kept
    write_atomic(tmp / "run.json", json.dumps(meta) + "\n")
    tmp.rename(dest)
    return dest


def _cudnn(version: Any) -> str:
    """cuDNN's version as torch reports it (91900) written as people do (9.19.0); "" if none."""
    if not isinstance(version, int):
        return "" if version is None else str(version)
    if version >= 10000:  # cuDNN 9 on
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"  # cuDNN 8: 8907 is 8.9.7


def _command_of(sweep: Path) -> str:
    """The sweep's command line as Hydra recorded it (multirun.yaml's task overrides)."""
    from omegaconf import OmegaConf

    recorded = sweep / "multirun.yaml"
    if not recorded.is_file():
        return ""
    task = OmegaConf.select(OmegaConf.load(recorded), "hydra.overrides.task") or []
    return "python -m sweepbench -m " + " ".join(shlex.quote(str(t)) for t in task)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/pages.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--root", type=Path, default=Path("docs/results"), help="the folder holding runs/ (default docs/results)"
    )
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed page differs")
    ap.add_argument("--add", type=Path, metavar="SWEEP_DIR", help="first keep this finished sweep as a raw run")
    ap.add_argument("--name", help="the raw run's name with --add: <benchmark>_<machine>_<YYYY-MM-DD>[_<what>]")
    ap.add_argument("--command", default="", help="with --add: the command that ran the sweep (default: as recorded)")
    ap.add_argument(
        "--not-kept",
        default="",
        metavar="REASON",
        help="with --add: the code this sweep measured was not kept, and why (its rows yield to kept runs')",
    )
    a = ap.parse_args(argv)
    if not (a.root / "runs").is_dir():
        print(
            f"--root {a.root}: no runs/ folder in it; valid: a folder holding runs/<benchmark>_<machine>_<date>/",
            file=sys.stderr,
        )
        return 2
    if a.add is not None or a.not_kept:
        try:
            if a.add is None:
                raise ValueError(
                    "--not-kept says why a sweep kept with --add measured code that was not kept; "
                    "give it with --add SWEEP_DIR --name ..."
                )
            if not a.name:
                raise ValueError("--add needs --name <benchmark>_<machine>_<YYYY-MM-DD>[_<what>]")
            print(f"kept {a.add} as {add_run(a.add, a.root, a.name, command=a.command, not_kept=a.not_kept)}")
        except ValueError as err:
            print(f"python bench/pages.py: {err}", file=sys.stderr)
            return 2
    files = render_all(a.root)
    stale = [n for n, text in files.items() if not (a.root / n).is_file() or (a.root / n).read_text() != text]
    if a.check:
        for n in stale:
            print(f"{a.root / n} differs from what the raw runs give; run python bench/pages.py")
        return 1 if stale else 0
    for n in stale:
        write_atomic(a.root / n, files[n])
    print(f"{len(files)} files, {len(stale)} written under {a.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
