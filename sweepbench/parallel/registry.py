"""A tiny name -> object registry used for sharding rules, balance modes and strategies."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; registering a name twice or looking up an unknown name raises ValueError."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._modules: dict[str, str] = {}  # declared name -> module that registers it on import

    def declare(self, name: str, module: str) -> None:
        """Make ``name`` valid before its module is imported (validation on the driver, which
        never imports torch): ``get`` imports ``module``, which must register ``name``."""
        self._modules[name] = module

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REG.register("name")`` adds the decorated object under ``name``."""

        def deco(obj: T) -> T:
            declared = self._modules.get(name)
            if name in self._items or (declared and getattr(obj, "__module__", declared) != declared):
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items and name in self._modules:
            importlib.import_module(self._modules[name])
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._items) | set(self._modules)))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
