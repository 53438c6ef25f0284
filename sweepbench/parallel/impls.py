"""Refit implementations: ours and peers behind one interface, so one sweep times and verifies them
the same way (``benchmark.impl=sweepbench,megatron``).

An implementation is a builder ``build(src, dst, *, model, strategy, options, backend, device,
seed) -> Transfer`` registered under a name; the benchmark times ``step`` with ``poison`` before
and ``verify`` after every iteration. Importable without torch: names are declared with the
module that registers them, and an optional peer names the module it needs and the install
command, so a missing extra is refused on the driver before any rank starts."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sweepbench.core import Registry


class Transfer(Protocol):
    """One planned weight transfer on this rank, ready to run (every rank holds one)."""

    plan_digest: str  # identifies the plan (same on every rank)
    method: str  # what moves the bytes, for the record (a strategy, a peer's copy service)

    def step(self) -> None:
        """Move the weights (collective: every rank calls it)."""

    def poison(self) -> None:
        """Overwrite the destination weights (NaN) so a step that moves nothing cannot verify."""

    def verify(self) -> list[str]:
        """Bit-exact check of this rank's destination weights; one line per problem."""

    def traffic(self) -> tuple[int, int]:
        """(bytes this rank sends, bytes it receives) over links."""


IMPLS: Registry[Any] = Registry("refit implementation")
IMPLS.declare("sweepbench", f"{__package__}.sweepbench_refit")
IMPLS.declare("megatron", f"{__package__}.megatron_refit")

# impl -> (module it imports, the command that installs it)
REQUIRES: dict[str, tuple[str, str]] = {"megatron": ("megatron.core", 'pip install "sweepbench[megatron]"')}


Degrees = Mapping[str, int]


def _megatron_layouts(train: Degrees, infer: Degrees) -> str | None:
    if max(train["ep"], infer["ep"]) > 1:
        return (
            "benchmark.impl=megatron does not support ep>1: megatron-core matches experts across layouts by "
            "Transformer Engine's per-expert weight names, and its local layer spec (SequentialMLP) has none, "
            "so experts land on the wrong ranks (the check fails); use ep1 layouts or impl=sweepbench"
        )
    return None


# impl -> why a (training, inference) pair of layouts is beyond it (one line), or None
LAYOUT_CHECKS: dict[str, Callable[[Degrees, Degrees], str | None]] = {"megatron": _megatron_layouts}


def missing(impl: str) -> str | None:
    """Why ``impl`` cannot run in this interpreter (one line), or None when it can."""
    need = REQUIRES.get(impl)
    if need is None:
        return None
    try:
        found = importlib.util.find_spec(need[0]) is not None
    except ImportError:  # the parent package is missing (or an import hook refuses it)
        found = False
    return (
        None if found else f"benchmark.impl={impl} needs {need[0]}, which is not installed; install it with: {need[1]}"
    )


def check_impl(impl: str, train: Degrees, infer: Degrees) -> None:
    """ValueError (one line) for an unknown implementation, one whose extra is not installed, or
    layouts it cannot refit."""
    IMPLS.check(impl, key="benchmark.impl")
    check = LAYOUT_CHECKS.get(impl)
    why = missing(impl) or (check(train, infer) if check else None)
    if why:
        raise ValueError(why)
