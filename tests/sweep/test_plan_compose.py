"""The planner's fast path (compose once per choice of config groups, then apply each job's value
overrides to a copy) gives every job exactly what Hydra's per-job compose gives: the same config
(values, types, flags), the same validation result or error line, the same fit note and tag."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from sweepbench.launch.preflight import fit_note, validate_config
from sweepbench.sweep.compose import JobComposer, compose_slowly
from sweepbench.sweep.errors import error_line
from sweepbench.sweep.tags import make_tag


def _grid(*axes: list[str]) -> list[list[str]]:
    return [list(job) for job in itertools.product(*axes)]


GRIDS: dict[str, tuple[list[str], list[list[str]]]] = {
    # (overrides of the whole sweep, the jobs' own overrides)
    "finetune_fms": (["experiment=finetune_fms"], _grid(
        ["model=llama3_1b", "model=llama3_3b"], ["parallelism=tp1", "parallelism=dp2"],
        ["benchmark.lora_rank=0", "benchmark.lora_rank=16"], ["benchmark.compile=false", "benchmark.compile=true"],
        ["benchmark.seq_len=1024", "benchmark.seq_len=4096"])),
    "ring_dilated_seed": (["experiment=ring_dilated_seed"], _grid(
        ["parallelism=cp1", "parallelism=cp2", "parallelism=cp8"],
        ["benchmark.seq_len=16384", "benchmark.seq_len=65536", "benchmark.seq_len=1000"],
        ["benchmark.segment_lengths=[2048,4096,8192]", "benchmark.segment_lengths=[1024]"])),
    "refit": (["benchmark=refit", "experiment=tp2-tp1"], _grid(
        ["mode=collocated", "mode=non_collocated"], ["benchmark.strategy=send_recv", "benchmark.strategy=ipc",
                                                     "benchmark.strategy=nope"],
        ["backend=gloo", "backend=auto", "backend=nccl"])),
    "odd overrides": (["benchmark=collective"], [
        ["benchmark.ops=[all_reduce]", "parallelism=tp2"], ["parallelism=tp2", "benchmark.iters=3", "benchmark.iters=4"],
        ["++benchmark.iters=7"], ["+benchmark.extra=1"], ["+launch.python=/envs/t29/bin/python"],
        ["benchmark.iters=many"], ["benchmark.itres=3"], ["model=nope"], ["parallelism.dp=512"],
        ["benchmark.iters=0"], ["model.seq_len=${model.hidden_size}", "model=tiny"], ["benchmark=refit"],
        ["benchmark=refit", "benchmark.inference=tp3"]]),
}


def _plan(compose_job: Any, overrides: list[str]) -> dict[str, Any]:
    """What the planner gets from one job: its config (or the error composing it), validation,
    fit note and tag."""
    try:
        cfg: DictConfig = compose_job(overrides)
    except (HydraException, ValueError) as err:
        return {"error": error_line(err)}
    out: dict[str, Any] = {
        "yaml": OmegaConf.to_yaml(cfg), "struct": OmegaConf.is_struct(cfg),
        "types": {k: OmegaConf.get_type(cfg, k) for k in cfg},
    }
    try:
        out["resolved"] = OmegaConf.to_container(cfg, resolve=True)
        world_size = validate_config(cfg)
        out |= {"world_size": world_size, "fit": fit_note(cfg, world_size, local=True),
                "tag": make_tag(cfg, world_size=world_size)}
    except (ValueError, HydraException) as err:
        out["error"] = error_line(err)
    return out


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_fast_path_plans_every_job_as_the_per_job_compose(compose: Any, name: str) -> None:
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    sweep, jobs = GRIDS[name]
    master = hydra.compose(config_name="config", overrides=sweep, return_hydra_config=True)
    loader = GlobalHydra.instance().config_loader()
    composer = JobComposer(loader, master)
    outcomes = set()
    for job in jobs:
        overrides = [*sweep, *job]
        fast = _plan(composer.compose, overrides)
        slow = _plan(lambda o: compose_slowly(loader, master, o), overrides)
        assert fast == slow, f"{name}: {overrides}"
        outcomes.add("error" if "error" in fast else "fit note" if fast["fit"] else "fits")
    assert len(composer.bases) < len(jobs) or name == "odd overrides"
    if name == "odd overrides":
        assert outcomes == {"error", "fits", "fit note"}
