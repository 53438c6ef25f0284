"""``world4``: one session-wide group of 4 spawned gloo processes for the engine tests (cp2 runs on
a subgroup of its first two ranks), restarted if an earlier test broke it."""

from __future__ import annotations

import pytest

from tests.parallel.world import World, Worlds


@pytest.fixture()
def world4(worlds: Worlds) -> World:
    return worlds.get(4)
