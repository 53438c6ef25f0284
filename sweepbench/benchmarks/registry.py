"""The benchmark registry: name -> Benchmark class. Nothing else branches on a benchmark's name."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, TypeVar

from sweepbench.benchmarks.base import Benchmark
from sweepbench.config.store import store_benchmark_schema
from sweepbench.core import Registry

_BENCHMARKS: Registry[type[Benchmark]] = Registry("benchmark")
B = TypeVar("B", bound=type[Benchmark])


def register(name: str) -> Callable[[B], B]:
    def wrap(cls: B) -> B:
        _BENCHMARKS.add(name, cls)
        store_benchmark_schema(name, cls.schema)
        return cls

    return wrap


def get_benchmark(name: str) -> type[Benchmark]:
    load_all()
    return _BENCHMARKS.get(name)


def benchmark_names() -> list[str]:
    load_all()
    return list(_BENCHMARKS.names())


_loaded = False


def load_all() -> None:
    """Import every module of sweepbench.benchmarks so that each registers itself (once: a
    planner asks for a benchmark several times per job)."""
    global _loaded
    if _loaded:
        return
    import sweepbench.benchmarks as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in {"base", "registry"}:
            importlib.import_module(f"{pkg.__name__}.{mod.name}")
    _loaded = True
