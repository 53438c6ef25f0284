"""The strategy registry, importable without torch: each strategy is declared with the module that
implements (and registers) it, so a config can be validated on the driver before any rank starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweepbench.core import Registry


if TYPE_CHECKING:
    from .comm import Executor

STRATEGIES: Registry[type[Executor]] = Registry("strategy")
_MODULES = {
    "send_recv": "p2p",
    "pipeline": "p2p",
    "ipc": "ipc",
    "broadcast": "broadcast",
    "naive": "naive",
    "nvshmem": "symm",
}
for _name, _module in _MODULES.items():
    STRATEGIES.declare(_name, f"{__package__}.{_module}")

# strategies that move bytes between GPU memories (CUDA IPC, symmetric memory): refused on gloo
GPU_ONLY: frozenset[str] = frozenset({"ipc", "nvshmem"})
