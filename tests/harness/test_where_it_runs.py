"""Where users run it: a machine with fewer GPUs than a job's ranks (faked through NVML, the only
part that says how many GPUs there are), jobs that do not fit (skipped, listed up front, exit 3),
output that is not a terminal (plain lines, every number whole), and train memory estimates
against the peaks CPU runs measure."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from sweepbench.draw.units import format_number

from ..conftest import TERMINAL, TINY, SweepRun, base_env, run_sweepbench

FAKE_NVML = '''"""NVML of a machine with SWEEPBENCH_FAKE_GPUS GPUs of 80 GiB each (a test's stand-in)."""
import os

_GPUS = int(os.environ.get("SWEEPBENCH_FAKE_GPUS", "0"))


class _Memory:
    total = 80 << 30
    used = 0
    free = total


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return _GPUS


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < _GPUS:
        raise RuntimeError(f"no GPU {index}")
    return index


def nvmlDeviceGetMemoryInfo(handle):
    return _Memory()


def nvmlDeviceGetName(handle):
    return "fake GPU"


def nvmlSystemGetDriverVersion():
    return "0"
'''
SKIP_GRID = [*TINY, "parallelism=tp1,tp2,tp4", "benchmark.max_bytes=1024,4096", "launch.max_local_ranks=2"]


def with_gpus(root: Path, count: int, **extra: str) -> dict[str, str]:
    """The environment of a sweep on a machine whose NVML reports ``count`` GPUs."""
    folder = root / "fake_nvml"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pynvml.py").write_text(FAKE_NVML)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH", "")]))
    return base_env(PYTHONPATH=path, SWEEPBENCH_FAKE_GPUS=str(count), **extra)


def test_main_command_on_one_gpu_runs_on_the_cpu_and_says_so(tmp_path: Path) -> None:
    """``python -m sweepbench`` (refit tp2 -> tp1, 2 ranks) where one GPU is visible: gloo on the CPU,
    one line saying so and how to require GPUs, exit 0; the backend used is in results.csv."""
    run = run_sweepbench([], sweep_dir=tmp_path / "sweep", multirun=False, env=with_gpus(tmp_path, 1))
    assert run.rc == 0, run.describe()
    notes = [line for line in run.stdout.splitlines() if "backend=auto:" in line]
    assert len(notes) == 1 and "2 ranks per node, 1 GPU visible: running on the CPU with gloo" in notes[0] \
        and "backend=nccl" in notes[0], run.stdout[-2000:]
    (row,) = run.results().to_dict("records")
    assert row["status"] == "ok" and row["backend"] == "gloo"
    (metrics,) = run.all_metrics().values()
    assert metrics["backend"] == "gloo" and metrics["config"]["backend"]["name"] == "auto"


def test_backend_nccl_keeps_refusing_a_machine_without_its_gpus(tmp_path: Path) -> None:
    run = run_sweepbench(["backend=nccl"], sweep_dir=tmp_path / "sweep", multirun=False, env=with_gpus(tmp_path, 1))
    assert run.rc == 2, run.describe()
    (line,) = run.stderr.strip().splitlines()
    assert "2 ranks per node need 2 GPUs, but 1 are visible" in line
    assert not run.sweep_dir.exists()


def _dry_lines(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("jobs, one per line:"))
    out = {}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        tag, _, rest = line.strip().partition(": ")
        out[tag] = rest
    return out


@pytest.mark.parametrize("backend", ["nccl", "auto"])
def test_layouts_up_to_what_the_box_holds(tmp_path: Path, backend: str) -> None:
    """``-m parallelism=tp2,tp4`` on a 2-GPU machine, planned: tp2 fits its GPUs; tp4 does not fit
    with backend=nccl (a run skips it), and backend=auto runs it on the CPU."""
    run = run_sweepbench(["parallelism=tp2,tp4", f"backend={backend}", "sweep.dry_run=true"],
                         sweep_dir=tmp_path / "sweep", env=with_gpus(tmp_path, 2, COLUMNS="80"))
    assert run.rc == 0, run.describe()
    lines = _dry_lines(run.stdout)
    (tp2,) = [v for k, v in lines.items() if "_tp2_" in k]
    (tp4,) = [v for k, v in lines.items() if "_tp4_" in k]
    if backend == "nccl":
        assert "backend nccl, fits here: yes;" in tp2
        assert "fits here: no: 4 ranks per node need 4 GPUs, but 2 are visible" in tp4
        assert "1 of 2 jobs would not run from this machine" in run.stdout
    else:
        assert "backend auto -> nccl, fits here: yes;" in tp2 and "backend auto -> gloo, fits here: yes;" in tp4
    assert not run.sweep_dir.exists()


# ---------------------------------------------------------------- a sweep whose jobs do not all fit


@pytest.fixture(scope="module")
def skip_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepRun, SweepRun]:
    """The grid once piped at 80 columns (tp4 does not fit: 2 local ranks at most), then resumed
    with rich drawing as on an 80-column terminal (nothing runs again)."""
    root = tmp_path_factory.mktemp("skip_sweep")
    first = run_sweepbench(SKIP_GRID, sweep_dir=root / "sweep", cwd=root, env=base_env(COLUMNS="80"))
    again = run_sweepbench(SKIP_GRID, sweep_dir=root / "sweep", cwd=root, env=base_env(COLUMNS="80", **TERMINAL))
    return first, again


def test_unfit_jobs_are_skipped_listed_first_and_exit_3(skip_sweep: tuple[SweepRun, SweepRun]) -> None:
    run, _ = skip_sweep
    assert run.rc == 3, run.describe()
    out = run.stdout.splitlines()
    head = out.index("sweepbench: skipping 2 of 6 jobs that cannot run where they would, each with why "
                     "(sweep.on_unfit=refuse refuses the sweep instead):")
    first_job = next(i for i, line in enumerate(out) if re.match(r"^\[1/4\] ", line))
    listed = out[head + 1:head + 3]
    assert head < first_job and all("_tp4_" in line and "set launch.max_local_ranks=4" in line for line in listed)
    table = run.results()
    assert sorted(table["status"]) == ["ok"] * 4 + ["skipped"] * 2
    skipped = table[table["status"] == "skipped"]
    assert (skipped["parallelism"] == "tp4").all() and (skipped["world_size"] == 4).all()
    assert skipped["error"].str.contains("at most 2 local ranks").all()
    assert "2 of 6 jobs skipped, they cannot run where they would (" in run.stderr, run.stderr
    assert "did not finish ok" not in run.stderr
    # the one reason both share, named in the last line
    assert re.search(r"jobs skipped, they cannot run where they would \(.*at most 2 local ranks", run.stderr)
    assert not any((run.sweep_dir / tag).exists() for tag in skipped["tag"])  # nothing written for them
    from sweepbench.report.load import load_sweep

    loaded = {j["tag"]: j["status"] for j in load_sweep(run.sweep_dir).jobs}
    assert sorted(loaded.values()) == ["ok"] * 4 + ["skipped"] * 2


def test_refuse_switch_keeps_the_whole_sweep_out(tmp_path: Path) -> None:
    run = run_sweepbench([*SKIP_GRID, "sweep.on_unfit=refuse"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2, run.describe()
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("sweepbench: error: world_size=4 is far beyond") and "sweep.on_unfit=refuse" in line
    assert not run.sweep_dir.exists()
    bad = run_sweepbench([*SKIP_GRID, "sweep.on_unfit=maybe"], sweep_dir=tmp_path / "sweep2")
    assert bad.rc == 2 and bad.stderr.strip() == ("sweepbench: error: sweep.on_unfit='maybe' is not valid; "
                                                  "choose one of skip, refuse"), bad.describe()


def _size(run: SweepRun, tag: str) -> str:
    return {1024: "1 KiB", 4096: "4 KiB"}[run.metrics(tag)["config"]["benchmark"]["max_bytes"]]


def test_piped_summary_has_every_number_whole(skip_sweep: tuple[SweepRun, SweepRun]) -> None:
    """Not a terminal: one line per job, tag, status, every headline number with its label; each
    number is results.csv's, whole (4 significant digits)."""
    run, _ = skip_sweep
    table = run.results().set_index("tag")
    lines = {line.strip().split(":")[0]: line for line in run.stdout.splitlines()
             if line.startswith("  collective-")}
    assert set(lines) == set(table.index)
    for tag, line in lines.items():
        row = table.loc[tag]
        if row["status"] != "ok":
            assert f"{tag}: skipped, 4 ranks: world_size=4" in line
            continue
        size = _size(run, tag)
        for key, unit in (("all_reduce_busbw_gbps", f"all_reduce busbw GB/s @{size} "),
                          ("all_reduce_median_s", f"all_reduce median s @{size} ")):
            value = row[key]
            shown = format_number(value)
            assert unit + shown in line, (key, line)


def test_terminal_summary_cuts_no_number_and_labels_hold(skip_sweep: tuple[SweepRun, SweepRun]) -> None:
    """An 80-column terminal: the summary table's numbers are whole, and where the jobs' sizes
    differ (1 KiB, 4 KiB) no column claims one size for every row: each cell says its own."""
    _, run = skip_sweep
    assert run.rc == 3, run.describe()
    lines = run.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if line[:1] in "┏┃│┡└")
    header = "\n".join(line for line in lines if line.startswith("┃"))
    assert "@1 KiB" not in header and "@4 KiB" not in header
    rows: list[tuple[str, str]] = []  # (tag, the row's first line): a tag folds over the row's lines
    for line in lines:
        if line.startswith("│ collective-"):
            rows.append((line.split("│")[1].strip(), line))
        elif line.startswith("│") and rows and "ok" not in line and "skipped" not in line:
            rows[-1] = (rows[-1][0] + line.split("│")[1].strip(), rows[-1][1])
        elif line.startswith("└"):
            break
    table = run.results().set_index("tag")
    assert sorted(tag for tag, _ in rows) == sorted(table.index)
    for tag, line in rows:
        row = table.loc[tag]
        if row["status"] != "ok":
            continue
        value = row["all_reduce_busbw_gbps"]
        assert f"{format_number(value)} @{_size(run, tag)}" in line, line


def test_report_labels_hold_for_their_rows(skip_sweep: tuple[SweepRun, SweepRun]) -> None:
    """report.html's results table: a job's number sits only under its own size's column."""
    from sweepbench.report.load import load_sweep
    from sweepbench.report.page import results_table

    run, _ = skip_sweep
    jobs = load_sweep(run.sweep_dir).jobs
    columns, rows = results_table(jobs)
    sized = {c: c.rsplit("@", 1)[1] for c in columns if "@" in c}
    assert set(sized.values()) == {"1 KiB", "4 KiB"}
    for job, row in zip(jobs, rows):
        cells = dict(zip(columns, (cell.text for cell in row)))
        if job["status"] != "ok":
            continue
        size = _size(run, job["tag"])
        assert all(bool(cells[c]) == (s == size) for c, s in sized.items()), (job["tag"], cells)


# ---------------------------------------------------------------- train memory estimates against CPU peaks

MEMORY_GRID = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=dp2", "benchmark.dp_shard=ddp,fsdp",
               "model.num_layers=2", "model.hidden_size=512", "model.ffn_hidden_size=2048", "model.vocab_size=32000",
               "benchmark.seq_len=32", "benchmark.warmup=0", "benchmark.iters=2", "benchmark.verify_steps=1",
               "wandb.mode=disabled"]


def test_train_memory_estimate_within_30_percent_of_the_cpu_peak(tmp_path: Path) -> None:
    """A 41M-parameter model (AdamW states of ~600 MiB) on 2 CPU ranks, DDP (the whole model per
    rank, and its gradient buckets) and FSDP (half each, after the whole single-device reference):
    each rank's peak anonymous memory against the estimate the fit check uses."""
    from sweepbench.benchmarks.train import TrainBenchmark, build_job
    from sweepbench.train.plan import layout_bytes, build_plan
    from sweepbench.train.shape import shape_of

    run = run_sweepbench(MEMORY_GRID, sweep_dir=tmp_path / "sweep", timeout=300)
    assert run.rc == 0, run.describe()
    seen = {}
    for metrics in run.all_metrics().values():
        cfg = OmegaConf.create(metrics["config"])
        estimate = TrainBenchmark.memory_bytes(cfg, metrics["world_size"])
        peaks = [r["host_peak_anon_bytes"] for r in metrics["results"]["memory_per_rank"]]
        # no NVML on a CPU: neither its peak nor its check against the allocator
        assert all(r["nvml_peak_bytes"] is None and r["nvml_shortfall_bytes"] is None
                   for r in metrics["results"]["memory_per_rank"])
        # nor how the GPU ran (clock, power, temperature): recorded empty, per rank and in results.csv
        assert metrics["gpu_state"] == {"gpu_sm_mhz_median": None, "gpu_power_w_median": None,
                                        "gpu_power_capped_pct": None, "gpu_temperature_c_max": None,
                                        "per_rank": [None, None]}
        assert len(peaks) == 2 and all(0.7 * estimate <= p <= 1.3 * estimate for p in peaks), (estimate, peaks)
        plan, shape = build_plan(build_job(cfg)), shape_of(cfg.model)
        seen[cfg.benchmark.dp_shard] = layout_bytes(shape, plan, lora_rank=0, dp_shard=cfg.benchmark.dp_shard,
                                                    ac="none")
    assert seen["ddp"] > 2 * seen["fsdp"]  # DDP's rank holds the whole model (and a copy of its gradients)


def test_a_96_job_dry_run_piped_is_one_whole_line_per_job(tmp_path: Path) -> None:
    """A dry run of 96 jobs through a pipe at 80 columns: one line per job, each tag whole (a rich
    table wrapped each tag into a 7-character column, 1,244 lines)."""
    grid = [*TINY, "parallelism=tp1,tp2,tp4,tp8", "benchmark.max_bytes=1024,2048,4096,8192,16384,32768",
            "benchmark.warmup=0,1,2,3", "sweep.dry_run=true"]
    run = run_sweepbench(grid, sweep_dir=tmp_path / "sweep", env=base_env(COLUMNS="80"))
    assert run.rc == 0, run.describe()
    lines = _dry_lines(run.stdout)
    assert len(lines) == 96, run.stdout[-2000:]
    tags = {tag for tag in lines if re.fullmatch(r"collective-\S+_ws[1248]_[0-9a-f]{8}", tag)}
    assert len(tags) == 96, sorted(set(lines) - tags)[:5]
    job_lines = [line for line in run.stdout.splitlines() if line.strip().split(":")[0] in lines]
    assert len(job_lines) == 96
    assert not run.sweep_dir.exists()
