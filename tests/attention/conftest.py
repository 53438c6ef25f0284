"""``world4``: one session-wide group of 4 spawned gloo processes for the engine tests (cp2 runs on
a subgroup of its first two ranks), restarted if an earlier test broke it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.parallel.world import World


@pytest.fixture(scope="session")
def _attention_world() -> Iterator[dict[str, World]]:
    holder: dict[str, World] = {}
    yield holder
    if "world" in holder:
        holder["world"].close()


@pytest.fixture()
def world4(_attention_world: dict[str, World]) -> World:
    w = _attention_world.get("world")
    if w is None or w.broken:
        if w is not None:
            w.close()
        w = _attention_world["world"] = World(4)
    return w
