"""Ranks forked from the driver's warm interpreter (``launch.preload``, on by default): real
sweeps, one forked and one started fresh (``launch.preload=false``), the same job either way, and
the rule for when a fork would not give the same process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from sweepbench.launch import preload

from ..conftest import TINY, run_sweepbench


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
