"""Layout strings shared by the layout benchmarks: ``tp4``, ``tp2pp2``, ``ep4`` -> degrees.

A layout string is a run of ``<axis><degree>`` with axes tp, pp, ep, dp, cp (each at most once);
axes left out have degree 1. The parallelism group's option names follow the same grammar."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

AXES = ("tp", "pp", "ep", "dp", "cp")
_TERM = re.compile(r"(tp|pp|ep|dp|cp)([1-9][0-9]*)")


def parse_layout(text: str, *, key: str) -> dict[str, int]:
    degrees = dict.fromkeys(AXES, 1)
    pos, seen = 0, set()
    for m in _TERM.finditer(text):
        if m.start() != pos or m.group(1) in seen:
            break
        degrees[m.group(1)] = int(m.group(2))
        seen.add(m.group(1))
        pos = m.end()
    if not text or pos != len(text):
        raise ValueError(
            f"{key}={text!r} is not a layout; write degrees like tp4, tp2pp2, ep4 "
            f"(axes {', '.join(AXES)}, each once, degrees >= 1)"
        )
    return degrees


def degrees_of(par: Any) -> dict[str, int]:
    """The degrees of a parallelism config node."""
    return {axis: int(par[axis]) for axis in AXES}


def world_of(degrees: dict[str, int]) -> int:
    return math.prod(degrees.values())


@dataclass(frozen=True)
class NamedLayout:
    """A layout string's degrees, read as a parallelism config node is (``.name``, ``.tp``, ...)."""

    name: str
    tp: int
    pp: int
    ep: int
    dp: int
    cp: int


def as_node(degrees: dict[str, int], name: str) -> NamedLayout:
    return NamedLayout(name, **degrees)
