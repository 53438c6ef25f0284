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
