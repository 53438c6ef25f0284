"""megatron-core's refit as the ``megatron`` implementation, in a real 4-process gloo world: the
inference model's weights are checked bit for bit after every swap, and poisoned before it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import jobs
from .cases import MEGATRON_CASES
from .world import World


@pytest.fixture(scope="module")
def world4() -> Iterator[World]:
    world = World(4)
    yield world
    world.close()


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_refit_verifies(world4: World, case: tuple) -> None:  # type: ignore[type-arg]
    out = world4.run(jobs.megatron_job, case, 5, timeout=240)
    problems = [p for o in out for p in o["problems"]]
    assert not problems, "\n".join(problems[:10])
    assert len({o["digest"] for o in out}) == 1
    sent = sum(s for s, _ in (o["traffic"] for o in out))
    received = sum(r for _, r in (o["traffic"] for o in out))
    assert sent == received > 0  # every remote byte megatron sends arrives somewhere
    if case[0].startswith("nc-"):  # training ranks only send, inference ranks only receive
        assert all(o["traffic"][1] == 0 for o in out[:2]) and all(o["traffic"][0] == 0 for o in out[2:])


@pytest.fixture
def host_cuda_rng(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """megatron's RNG tracker with the CUDA generator's state calls served by a CPU generator (no
    GPU here); the tracker's bookkeeping, where "seed ... already exists" is raised, is megatron's
    own. The process-wide tracker is reset before and after."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    gen = torch.Generator()
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a, **k: gen.get_state())
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: gen.manual_seed(seed))
    monkeypatch.setattr(mrandom, "_set_cuda_rng_state", lambda state, *a, **k: gen.set_state(state))
    mrandom.initialize_rng_tracker(force_reset=True)
    yield
    mrandom.initialize_rng_tracker(force_reset=True)


def test_both_models_of_a_job_share_one_seeded_tracker(host_cuda_rng: None) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name

    from sweepbench.parallel.megatron_refit import seed_rng_tracker

    tracker = get_cuda_rng_tracker()
    with pytest.raises(Exception, match="seed 1234 already exists"):  # what one seed for two states did
        tracker.add("model-parallel-rng", 1234)
        tracker.add(get_expert_parallel_rng_tracker_name(), 1234)
    tracker.reset()
    seed_rng_tracker(1234)  # the training model
    states = tracker.get_states()
    assert {"model-parallel-rng", get_expert_parallel_rng_tracker_name()} <= set(states)
    seeds = set(tracker.seeds_)
    for _ in range(3):  # the inference model, then the next jobs in this process: no reseeding
        seed_rng_tracker(1234)
    assert get_cuda_rng_tracker() is tracker and tracker.seeds_ == seeds
    assert all(tracker.get_states()[k] is v for k, v in states.items())


def test_a_rank_without_the_model_names_every_group_megatron_0_19_reads() -> None:
    """Non-collocated, the rank without a model hands megatron-core a stand-in. megatron-core 0.19.2
    keys its refit plan on ``(pg.tp.size() if pg.tp else 1, pg.pp..., pg.ep..., pg.dp...,
    expt_tp...)`` of both models (``resharding/refit.py: _get_config_tuple``); a stand-in holding
    only ``dp`` failed every non-collocated megatron job on 2 H100s with
    ``AttributeError: 'types.SimpleNamespace' object has no attribute 'tp'``."""
    import torch.distributed as dist

    from sweepbench.parallel.megatron_refit import absent_groups

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        pg = absent_groups()
        expt_tp = getattr(pg, "expt_tp", None)
        key = tuple(g.size() if g else 1 for g in (pg.tp, pg.pp, pg.ep, pg.dp, expt_tp))
        assert key == (1, 1, 1, 1, 1) and pg.dp is dist.group.WORLD
    finally:
        dist.destroy_process_group()
