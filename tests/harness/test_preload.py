"""Ranks forked from the driver's warm interpreter (``launch.preload``, on by default): real
sweeps, one forked and one started fresh (``launch.preload=false``), the same job either way, and
the rule for when a fork would not give the same process."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from typing import Any

from omegaconf import OmegaConf

from sweepbench.launch import preload

from ..conftest import TINY, base_env, run_sweepbench, run_sweeps


def _jobs(sweep_dir: Path) -> list[dict]:
    return [json.loads(m.read_text()) for m in sorted(sweep_dir.glob("*/metrics.json"))]


def test_forked_ranks_run_the_same_jobs_without_the_interpreters_start(tmp_path: Path) -> None:
    forked = run_sweepbench([*TINY, "parallelism=tp2", "benchmark.iters=2,3"], sweep_dir=tmp_path / "forked")
    fresh = run_sweepbench([*TINY, "parallelism=tp2", "launch.preload=false"], sweep_dir=tmp_path / "fresh")
    assert forked.rc == 0 and fresh.rc == 0, forked.describe() + fresh.describe()
    jobs = {"forked": _jobs(tmp_path / "forked"), "fresh": _jobs(tmp_path / "fresh")}
    assert [len(j) for j in jobs.values()] == [2, 1]
    for how, ms in jobs.items():
        for m in ms:
            assert m["status"] == "ok" and m["verified"] and m["rank_start"] == how, (how, m["rank_start"])
            assert m["results"]["summary"]["all_reduce_median_s"] > 0
            env = json.loads((tmp_path / how / m["tag"] / "env.json").read_text())
            assert env["executable"] == sys.executable and "captured_by" not in env  # rank 0's own capture
            for rank in (0, 1):  # each rank's output in its own log, as for a started rank
                log = (tmp_path / how / m["tag"] / "logs" / f"rank{rank}.log").read_text()
                assert f"rank {rank} of 2" in log and "process group up" in log, log
    # a forked rank skips the interpreter's start and the imports (torch): milliseconds, where a
    # fresh interpreter takes a second or more on this machine
    starts = {how: [m["wall_phases_s"]["start"] for m in ms] for how, ms in jobs.items()}
    assert max(starts["forked"]) < 0.5 < min(starts["fresh"]), starts


def test_a_fork_is_used_only_where_it_gives_the_same_process(monkeypatch, tmp_path: Path) -> None:
    def cfg(**launch) -> OmegaConf:
        return OmegaConf.create({"launch": {"python": "", "preload": True, **launch}})

    monkeypatch.setattr(preload, "_server_env", None)
    assert preload.usable(cfg()) and preload.usable(cfg(python=sys.executable))
    assert not preload.usable(cfg(preload=False))
    assert not preload.usable(cfg(python="/usr/bin/false"))  # another interpreter: started fresh
    venv = tmp_path / "venv" / "bin" / "python"  # a venv's python: a link to this one, with other packages
    venv.parent.mkdir(parents=True)
    venv.symlink_to(sys.executable)
    assert not preload.usable(cfg(python=str(venv)))
    # the fork server's environment, once it runs: the same but wandb's variables, or fresh starts
    monkeypatch.setattr(preload, "_server_env", preload._env())
    monkeypatch.setenv("WANDB_SERVICE", "set by the driver's wandb after its first run")
    assert preload.usable(cfg())
    monkeypatch.setenv("PYTORCH_SOMETHING_READ_AT_IMPORT", "1")
    assert not preload.usable(cfg())
    assert "PYTORCH_SOMETHING_READ_AT_IMPORT" in os.environ


def _pid(log: Path) -> int:
    return int(re.search(r", pid (\d+),", log.read_text()).group(1))


def test_kept_ranks_run_the_next_jobs_in_the_same_processes(tmp_path: Path) -> None:
    """launch.keep_ranks: a rank whose job ended ok takes the next job's rank of its index (same pid,
    its log in the new job's folder, rank_start kept); a job that failed ends its ranks, so the next
    job forks new ones; nothing is left running after the sweep."""
    run = run_sweepbench([*TINY, "parallelism=tp2", "benchmark.iters=2,3", "fault.kind=none,raise", "fault.rank=1",
                          "launch.keep_ranks=true"], sweep_dir=tmp_path / "kept")
    assert run.rc == 1, run.describe()  # the two raising jobs failed
    jobs = {(m["config"]["benchmark"]["iters"], m["config"]["fault"]["kind"]): m for m in _jobs(tmp_path / "kept")}
    order = [(2, "none"), (2, "raise"), (3, "none"), (3, "raise")]  # the grid's order
    assert [jobs[k]["status"] for k in order] == ["ok", "failed", "ok", "failed"]
    assert "injected" in jobs[(2, "raise")]["error"] or "rank 1" in jobs[(2, "raise")]["error"], jobs[(2, "raise")]
    assert jobs[(2, "none")]["rank_start"] == "forked" and jobs[(3, "none")]["rank_start"] == "forked"
    assert jobs[(2, "none")]["verified"] and jobs[(3, "none")]["verified"]
    pids = {k: [_pid(tmp_path / "kept" / jobs[k]["tag"] / "logs" / f"rank{r}.log") for r in (0, 1)] for k in order}
    assert pids[(2, "raise")] == pids[(2, "none")]  # kept: the same processes ran the next job
    assert not set(pids[(3, "none")]) & set(pids[(2, "none")])  # after a failure: new ones
    assert pids[(3, "raise")] == pids[(3, "none")]
    for rank in (0, 1):  # each job's rank log holds that job only
        log = (tmp_path / "kept" / jobs[(2, "raise")]["tag"] / "logs" / f"rank{rank}.log").read_text()
        assert log.count("=====") == 2 and f"rank {rank} of 2" in log, log
    time.sleep(0.5)
    for pid in {p for ps in pids.values() for p in ps}:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid


def test_kept_ranks_with_rounds_or_fresh_ranks_are_refused(tmp_path: Path) -> None:
    for extra, words in ((["sweep.repeats=2"], "sweep.repeats=2"), (["launch.preload=false"], "launch.preload=false")):
        run = run_sweepbench([*TINY, "parallelism=tp1", "launch.keep_ranks=true", *extra], sweep_dir=tmp_path / "x")
        lines = run.stderr.strip().splitlines()
        assert run.rc == 2 and len(lines) == 1 and "launch.keep_ranks=true" in lines[0] and words in lines[0], run.describe()
        assert not (tmp_path / "x").exists() or not list((tmp_path / "x").glob("*/metrics.json"))


def test_kept_ranks_make_new_subgroups_for_the_next_jobs_world(tmp_path: Path) -> None:
    """USP splits the world into Ulysses and ring groups (``parallel.comm.subgroup``). A kept rank's
    next job is a new default group: the groups of the job before went with it, so they are made
    again, not looked up (found on the CPU run of the W=4 USP cases: the second USP job failed
    with 'Group ... is not registered')."""
    run = run_sweepbench(["benchmark=attention", "model=tiny", "backend=gloo", "benchmark.dtype=float32",
                          "parallelism=cp4", "benchmark.impl=usp", "benchmark.seq_len=64,128", "benchmark.iters=1",
                          "benchmark.warmup=1", "benchmark.t1_iters=1", "launch.keep_ranks=true"],
                         sweep_dir=tmp_path / "usp")
    assert run.rc == 0, run.describe()
    jobs = sorted(_jobs(tmp_path / "usp"), key=lambda m: m["config"]["benchmark"]["seq_len"])
    assert [(m["status"], m["verified"], m["rank_start"]) for m in jobs] == [("ok", True, "forked"), ("ok", True, "kept")]
    pids = [[_pid(tmp_path / "usp" / m["tag"] / "logs" / f"rank{r}.log") for r in range(4)] for m in jobs]
    assert pids[0] == pids[1]


def test_ranks_are_kept_by_default_only_on_gpus_for_a_benchmark_measured_the_same(compose: Any) -> None:
    """launch.keep_ranks=null (the default): kept for attention and one-rank train jobs on GPUs (their
    medians and peaks were measured the same kept or fresh), not for CPU ranks (a kept process's
    host memory is not a fresh one's), not for other benchmarks, not with rounds or another
    interpreter; true and false are obeyed. SLURM passes what its request asks for."""
    keeps = preload.keeps
    assert compose("benchmark=attention").launch.keep_ranks is None
    for bench, one in (("attention", "parallelism=cp1"), ("train", "parallelism=tp1")):
        assert keeps(compose(f"benchmark={bench}", one, "backend=nccl"))
        assert not keeps(compose(f"benchmark={bench}", one, "backend=gloo"))
        assert not keeps(compose(f"benchmark={bench}", one, "backend=nccl", "sweep.repeats=2"))
        assert not keeps(compose(f"benchmark={bench}", one, "backend=nccl", "launch.keep_ranks=false"))
        assert not keeps(compose(f"benchmark={bench}", one, "backend=nccl", "launch.preload=false"))
        assert not keeps(compose(f"benchmark={bench}", one, "backend=nccl", f"launch.python={sys.executable}x"))
        assert keeps(compose(f"benchmark={bench}", one, "backend=gloo"), on_gpus=True)  # a SLURM request for GPUs
    for bench in ("collective", "refit", "reshard"):
        assert not keeps(compose(f"benchmark={bench}", "backend=nccl"))
    # train keeps one-rank jobs only (several ranks kept on GPUs died at their next job's start)
    for layout in ("dp2", "tp2", "pp2"):
        assert not keeps(compose("benchmark=train", f"parallelism={layout}", "backend=nccl"))
        assert keeps(compose("benchmark=train", f"parallelism={layout}", "backend=nccl", "launch.keep_ranks=true"))
    assert keeps(compose("benchmark=attention", "parallelism=cp2", "backend=nccl"))
    assert keeps(compose("benchmark=collective", "backend=gloo", "launch.keep_ranks=true"))


def test_a_kept_rank_puts_back_what_a_job_changed_in_torchs_settings() -> None:
    """Between a kept rank's jobs, torch's compiler configs and backend flags go back to what the
    process started with (a job with async TP switches inductor's micro-pipelined TP on)."""
    import torch
    import torch._inductor.config

    fresh = preload._GlobalState()
    before = (torch._inductor.config._micro_pipeline_tp, torch.backends.cudnn.benchmark, torch.get_default_dtype())
    torch._inductor.config._micro_pipeline_tp = not before[0]
    torch.backends.cudnn.benchmark = not before[1]
    torch.set_default_dtype(torch.float64)
    fresh.restore()
    after = (torch._inductor.config._micro_pipeline_tp, torch.backends.cudnn.benchmark, torch.get_default_dtype())
    assert after == before


def test_a_kept_rank_imports_no_compiler_config_and_still_puts_back_one_a_job_imported() -> None:
    """A kept rank does not import torch's compiler configs (torch._dynamo's import costs seconds a
    sweep); one that a job imports and changes is put back to what it was when its import
    completed. In a fresh interpreter: this one has imported them already."""
    import subprocess
    import sys

    script = """
import sys, torch
from sweepbench.launch import preload
fresh = preload._GlobalState()
assert "torch._dynamo" not in sys.modules and "torch._inductor.config" not in sys.modules
import torch._inductor.config as inductor  # as a job that compiles
before = inductor._micro_pipeline_tp
inductor._micro_pipeline_tp = not before
fresh.restore()
assert inductor._micro_pipeline_tp == before
print(sorted(fresh.configs))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch._inductor.config" in done.stdout


def test_the_host_peak_is_the_jobs_own_after_a_reset() -> None:
    """A kept process reports each job's resident set peak: reset_peaks (at a job's start) puts the
    peak back to the current size, so an earlier job's larger peak does not show."""
    import torch

    from sweepbench.measure.memory import host_peak_rss_bytes, reset_peaks

    big = bytearray(256 * 2**20)
    big[::4096] = b"x" * len(big[::4096])  # touch every page
    peak = host_peak_rss_bytes()
    del big
    reset_peaks(torch.device("cpu"))
    assert host_peak_rss_bytes() < peak - 128 * 2**20


def test_the_fork_server_starts_before_the_first_job_and_its_ranks_fork_from_it() -> None:
    """``start_server`` (the driver calls it once the sweep's jobs are planned) starts the fork
    server and returns at once, while the server imports torch; a rank started after it forks
    from that same server. With ``launch.preload=false`` no server starts. In a fresh interpreter."""
    import subprocess

    script = """
import os, sys, tempfile, time
from pathlib import Path
from omegaconf import OmegaConf
from multiprocessing import forkserver
from sweepbench.launch import preload

def servers():
    mine = []
    for pid in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if pid.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"forkserver" in cmd:
            mine.append(int(pid))
    return mine

preload.start_server(OmegaConf.create({"launch": {"python": "", "preload": False}}))
assert servers() == [] and preload._server_env is None
tic = time.perf_counter()
preload.start_server(OmegaConf.create({"launch": {"python": "", "preload": True}}))
took = time.perf_counter() - tic
started = servers()
assert len(started) == 1 and preload._server_env == preload._env(), started
print("returned after", took)
assert took < 2.0, took  # it does not wait for the server's imports
log = Path(tempfile.mkdtemp()) / "rank.log"
rank = preload.start_rank(dict(os.environ, SWEEPBENCH_PRELOAD_PROBE="1"), log)
rank.proc.join(120)
assert servers() == started  # the rank came from the server started before it
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout


def test_ranks_fork_where_hydra_sets_each_jobs_variables(tmp_path: Path) -> None:
    """With ``hydra.job.env_set`` the fork server is not started before the first job (it would lack
    the job's variables, and every rank would start fresh): it starts with the first job's ranks,
    in the job's environment, and they fork from it."""
    run = run_sweepbench([*TINY, "parallelism=tp2", "benchmark.iters=2,3", "+hydra.job.env_set.SWEEPBENCH_PROBE=1"],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    assert [m["rank_start"] for m in _jobs(run.sweep_dir)] == ["forked", "forked"]


def test_the_fork_server_imports_once_what_a_sweeps_benchmark_names_for_its_ranks(tmp_path: Path) -> None:
    """``Benchmark.rank_imports``: a train sweep's fork server imports torch._dynamo (torch.optim's
    optimizers import it as they are made) before its first job, and its ranks do not import it
    again; started fresh (``launch.preload=false``) each rank imports it itself; a collective sweep
    imports it nowhere. Python's import-time report (PYTHONPROFILEIMPORTTIME) names what each
    process imported itself: the driver's and its fork server's on the sweep's stderr, a rank's in
    its log."""
    train = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=tp1", "benchmark.warmup=1",
             "benchmark.iters=2", "wandb.mode=disabled"]
    grids = {"forked": train, "fresh": [*train, "launch.preload=false"], "collective": [*TINY, "parallelism=tp2"]}
    env = base_env(PYTHONPROFILEIMPORTTIME="1")
    runs = run_sweeps(grids, tmp_path, env=env)
    dynamo = re.compile(r"\| torch\._dynamo$", re.M)
    imported = {}
    for how, run in runs.items():
        assert run.rc == 0, run.describe()
        (job,) = [p for p in run.sweep_dir.iterdir() if (p / "metrics.json").exists()]
        imported[how] = (bool(dynamo.search(run.stderr)), bool(dynamo.search((job / "logs" / "rank0.log").read_text())))
    # (driver or fork server, rank 0)
    assert imported == {"forked": (True, False), "fresh": (False, True), "collective": (False, False)}, imported
