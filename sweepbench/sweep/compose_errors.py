"""Hydra composes a sweep's config before the sweeper runs; an error there (a typo'd key, a wrong
type, an unknown option) would come out in several lines with exit 1. ``HYDRA_FULL_ERROR`` lets
it reach main(), to be reported like any other bad input: one line, exit 2. Once the sweeper
has the composed config, Hydra reports errors its own way again (and the jobs do not see it)."""

from __future__ import annotations

import os

_FULL_ERROR = "HYDRA_FULL_ERROR"
_raising: list[bool] = []


def raise_compose_errors() -> None:
    """Called by main() before Hydra composes (unless the user set HYDRA_FULL_ERROR=1 already)."""
    if os.environ.get(_FULL_ERROR) != "1":
        os.environ[_FULL_ERROR] = "1"
        _raising.append(True)


def raising() -> bool:
    """Is a compose error main()'s to report (the config is not composed yet)?"""
    return bool(_raising)


def composed() -> None:
    """Called by the sweeper once Hydra has composed the sweep's config."""
    if _raising:
        os.environ.pop(_FULL_ERROR, None)
        _raising.clear()
