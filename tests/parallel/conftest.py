"""Fixtures for the layout/resharding engine tests.

``world8`` is one session-wide group of 8 spawned gloo processes (restarted if an
earlier test broke it), shared by every multi-process test so that torch is
imported by 8 processes only once.
"""

from __future__ import annotations

import pytest

from .world import World, Worlds

WORLD_SIZE = 8


@pytest.fixture()
def world8(worlds: Worlds) -> World:
    return worlds.get(WORLD_SIZE)
