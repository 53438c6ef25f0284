"""Fixtures for the layout/resharding engine tests.

``world8`` is one session-wide group of 8 spawned gloo processes (restarted if an
earlier test broke it), shared by every multi-process test so that torch is
imported by 8 processes only once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .world import World

WORLD_SIZE = 8


@pytest.fixture(scope="session")
def _world_holder() -> Iterator[dict[str, World]]:
    holder: dict[str, World] = {}
    yield holder
    if "world" in holder:
        holder["world"].close()


@pytest.fixture()
def world8(_world_holder: dict[str, World]) -> World:
    w = _world_holder.get("world")
    if w is None or w.broken:
        if w is not None:
            w.close()
        w = _world_holder["world"] = World(WORLD_SIZE)
    return w
