"""The types every layer shares. This module imports nothing of sweepbench, so any folder may
import it: a rank's context and its timeout, a failed verification, the outcome of a job's launch,
and the registry every name -> code table is built on."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from omegaconf import DictConfig

if TYPE_CHECKING:  # torch is imported only where a job runs (ranks), never on the driver's path
    import torch


# A rank's own bound on a blocked collective or store wait, past launch.timeout_s: the job's deadline
# runs from before its ranks start, so with the same bound a rank that started fast (kept or forked)
# timed out in its collective at about the deadline, and a hung job was recorded failed instead of
# timeout, without the stacks the supervisor asks for when it ends a job at its deadline.
RANK_TIMEOUT_GRACE_S = 60.0


def rank_timeout(cfg: DictConfig) -> timedelta:
    """A rank's timeout for its process groups and its store: ``launch.timeout_s`` plus
    :data:`RANK_TIMEOUT_GRACE_S`, so that the local launcher's deadline ends a hung job first (under
    SLURM, whichever of this timeout and the job's time limit comes first ends it)."""
    return timedelta(seconds=cfg.launch.timeout_s + RANK_TIMEOUT_GRACE_S)


class NotOnThisMachine(ValueError):
    """A job that is valid in itself but cannot run where its device type resolved on this machine
    (``backend=auto``: e.g. a CUDA-only impl planned from a login node without GPUs). A dry run lists
    the job with this as its fit note; a real run refuses with it."""


class VerificationError(AssertionError):
    """A benchmark's output differs from its reference: the job fails, its times are not reported."""


@dataclass
class RankContext:
    """Where a rank stands: its place in the default process group and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: "torch.device"
    backend: str  # the backend actually used (never "auto")
    cfg: DictConfig  # the whole resolved job config
    job_dir: Path | None = None  # the job's directory (for files a benchmark writes: traces, event files)


@dataclass
class JobOutcome:
    status: str  # ok | failed | timeout | interrupted
    error: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)


T = TypeVar("T")


def load_entry(entry: str) -> Any:
    """The object ``entry`` ("module:attr") names, its module imported now."""
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Generic[T]):
    """A name -> value table (benchmarks, implementations, strategies, schedules), so that nothing
    branches on a name: looking up an unknown name raises ValueError naming it and the valid
    choices, and registering a name twice raises ValueError.

    A value is registered now (``add``, or ``register`` as a decorator), or declared by where its
    code lives, so that a config is checked on the driver without importing that code (torch):
    ``declare(name, "module:attr")`` imports the attribute on the first ``get``, and
    ``declare(name, "module")`` imports the module, which registers ``name`` itself.

    Choices are listed sorted, or in registration order with ``ordered=True`` (where that order says
    something: the simplest schedule first, "none" first)."""

    def __init__(self, kind: str, *, ordered: bool = False) -> None:
        self.kind = kind
        self.ordered = ordered
        self._names: dict[str, None] = {}  # every valid name, in registration order
        self._items: dict[str, T] = {}
        self._where: dict[str, str] = {}  # declared name -> "module:attr" or "module", imported on first get

    def add(self, name: str, value: T) -> T:
        declared = self._where.get(name)
        # a name declared with its module is registered once, by that module ("module:attr": never)
        if name in self._items or (declared is not None and getattr(value, "__module__", None) != declared):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._names.setdefault(name)
        self._items[name] = value
        return value

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REG.register("name")`` adds the decorated object under ``name``."""
        return lambda value: self.add(name, value)

    def declare(self, name: str, where: str) -> None:
        """Make ``name`` valid before its code is imported: ``where`` is "module:attr" (the value)
        or "module" (imported on the first ``get``, it registers ``name``)."""
        if name in self._names:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._names[name] = None
        self._where[name] = where

    def get(self, name: str, *, key: str | None = None) -> T:
        """The value of ``name``, importing its code on first use; ``key``: the config key that
        named it, for the error."""
        if name not in self._items and name in self._where:
            module, _, attr = self._where[name].partition(":")
            loaded = importlib.import_module(module)
            if attr:
                self._items[name] = getattr(loaded, attr)
            assert name in self._items, f"{module} does not register {self.kind} {name!r}"
        self.check(name, key=key)
        return self._items[name]

    def check(self, name: object, *, key: str | None = None) -> None:
        """ValueError (one line) unless ``name`` is valid; imports nothing."""
        if name not in self._names:
            said = f"{key}={name!r}" if key else f"unknown {self.kind} {name!r}"
            raise ValueError(f"{said}; valid: {', '.join(self.names())}")

    def names(self) -> tuple[str, ...]:
        return tuple(self._names) if self.ordered else tuple(sorted(self._names))

    def items(self) -> list[tuple[str, T]]:
        """Every (name, value), in ``names`` order (imports what was declared)."""
        return [(name, self.get(name)) for name in self.names()]

    def values(self) -> list[T]:
        return [value for _, value in self.items()]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._names)
