"""Local jobs that cannot fit this machine are refused before any rank starts, with one line
and the switch that forces them: far more ranks than cores, more memory than the host has."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweepbench.launch.preflight import check_local_fit, host_memory_bytes, validate

from ..conftest import base_env, run_sweepbench

CASES = {
    "ranks": (["benchmark=collective", "parallelism.dp=512"],
              "world_size=1024 is far beyond this machine's", "launch.max_local_ranks=1024"),
    "memory": (["experiment=tp2-tp1", "backend=gloo"], "more than this machine's", "launch.skip_memory_check=true"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_with_one_line_and_a_way_to_force(tmp_path: Path, case: str) -> None:
    args, what, force = CASES[case]
    run = run_sweepbench(args, sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: ") and what in lines[0] and force in lines[0]
    assert not (tmp_path / "sweep").exists()


def test_the_switches_force_it(compose) -> None:
    cfg = compose("parallelism.dp=512", "launch.max_local_ranks=1024")
    check_local_fit(cfg, validate(cfg))
    cfg = compose("benchmark=refit", "experiment=tp2-tp1", "backend=gloo", "launch.skip_memory_check=true")
    check_local_fit(cfg, validate(cfg))
    cfg = compose("benchmark=refit", "experiment=tp2-tp1", "backend=gloo")  # the estimate is real: 8B weights do not fit
    with pytest.raises(ValueError, match="skip_memory_check"):
        check_local_fit(cfg, validate(cfg))
    assert host_memory_bytes() > 1 << 30


def test_timeout_must_be_finite(compose) -> None:
    for bad in ("nan", "inf"):
        with pytest.raises(ValueError, match=rf"^launch.timeout_s={bad} must be a finite number"):
            validate(compose(f"launch.timeout_s={bad}"))


def _dry_run_listing(stdout: str) -> dict[str, str]:
    """tag -> its fit ("yes" or "no: why") from a dry run's lines (not a terminal: one per job)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("jobs, one per line:"))
    listing = {}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        tag, _, rest = line.strip().partition(": ")
        listing[tag] = rest.rpartition("; alone: ")[0].partition("fits here: ")[2]
    return listing


@pytest.mark.parametrize("experiment,bench_name,num_jobs", [("finetune_fms", "train", 96),
                                                          ("ring_dilated_seed", "attention", 12)])
def test_dry_run_of_a_gpu_grid_lists_every_job_with_its_fit_note(tmp_path: Path, compose, experiment: str,
                                                                bench_name: str, num_jobs: int) -> None:
    """The README's planning command, as written, on this CPU machine: every job listed, each
    with whether it would run from here and why not, exit 0, nothing written."""
    from sweepbench.launch.preflight import fit_note, validate_config
    from sweepbench.sweep.tags import make_tag

    from ..conftest import expand_grid

    run = run_sweepbench([f"experiment={experiment}", "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep",
                         cwd=tmp_path / "cwd", multirun=False, env=base_env(COLUMNS="80"))
    assert run.rc == 0, run.describe()
    listing = _dry_run_listing(run.stdout)
    assert len(listing) == num_jobs and f"{num_jobs} jobs" in run.stdout
    assert len(run.stdout.splitlines()) <= num_jobs + 2  # piped at 80 columns: one line per job, nothing wrapped
    saved = OmegaConf.load(Path(__file__).parents[2] / "conf" / "experiment" / f"{experiment}.yaml")
    grid = saved.hydra.sweeper.params
    for job in expand_grid([f"{k}={v}" for k, v in grid.items()]):
        cfg = compose(f"benchmark={bench_name}", f"experiment={experiment}", *job)
        world_size = validate_config(cfg, plan=True)  # as the planner does: a device check becomes the note
        note = fit_note(cfg, world_size, local=True)  # what this machine can hold, asked in-process
        assert listing[make_tag(cfg, world_size=world_size)] == (f"no: {note}" if note else "yes"), job
    misfits = sum(v != "yes" for v in listing.values())
    assert (f"{misfits} of {num_jobs} jobs would not run from this machine" in run.stdout) == (misfits > 0)
    assert not (tmp_path / "sweep").exists()


REFUSED_HERE = {  # a job valid in itself, refused by what this machine is (the note's start)
    "memory": (["experiment=finetune_fms", "model=llama3_70b", "parallelism=tp1", "benchmark.lora_rank=0",
                "benchmark.ac=none", "benchmark.compile=false", "benchmark.dp_shard=fsdp"],  # ~1 TiB of RAM
               "train needs about"),
    # backend=auto resolves to gloo on a host without GPUs: a CUDA-only peer is planned, not refused
    "device": (["experiment=attention_llama3", "parallelism=cp2", "benchmark.impl=torch_cp", "model.num_kv_heads=8",
                "benchmark.seq_len=16384"], "impl=torch_cp runs on cuda only, not cpu"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_HERE))
def test_dry_run_notes_a_job_a_real_run_refuses(tmp_path: Path, case: str) -> None:
    job, start = REFUSED_HERE[case]
    dry = run_sweepbench([*job, "sweep.dry_run=true"], sweep_dir=tmp_path / "dry", cwd=tmp_path / "cwd")
    assert dry.rc == 0, dry.describe()
    (note,) = _dry_run_listing(dry.stdout).values()
    assert note.startswith(f"no: {start}"), note
    assert case != "memory" or "launch.skip_memory_check=true" in note
    real = run_sweepbench(job, sweep_dir=tmp_path / "real", cwd=tmp_path / "cwd")
    assert real.rc == 2, real.describe()
    lines = real.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sweepbench: error: {start}") and note[4:] in lines[0]
    assert not (tmp_path / "real").exists() and not (tmp_path / "dry").exists()


def test_a_device_the_config_names_is_not_this_machines_guess(tmp_path: Path) -> None:
    """backend=gloo is the user's word, not this machine's: a CUDA-only impl on it is bad input even
    in a dry run (one line, exit 2)."""
    job = [*REFUSED_HERE["device"][0], "backend=gloo", "sweep.dry_run=true"]
    run = run_sweepbench(job, sweep_dir=tmp_path / "dry", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "impl=torch_cp runs on cuda only, not cpu" in lines[0]
