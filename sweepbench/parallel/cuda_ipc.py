"""CUDA IPC between the ranks of one node: export a rank's tensors once, open its peers' tensors
as local views of their memory, and find which ranks share a node.

A peer's tensor opened here is the peer's own memory (no copy): a ``copy_`` out of it is a
device-to-device transfer over NVLink or PCIe, which CUDA runs on a copy engine when both sides
are contiguous. Handles come from ``torch.multiprocessing.reductions.reduce_tensor`` (the
mechanism torch.multiprocessing uses to pass CUDA tensors between processes); they are picklable,
so they travel through ``all_gather_object``. The exporting rank must keep its tensors alive (and
at the same address) for as long as peers use the views.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

Handle = tuple[Any, tuple[Any, ...]]  # (rebuild function, its arguments)


def require_cuda(what: str, device: torch.device | None = None) -> torch.device:
    """The current CUDA device, or a RuntimeError saying why ``what`` cannot run here."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs CUDA GPUs (CUDA IPC between the GPUs of a node); "
            f"torch.cuda.is_available() is False: use send_recv on CPU/gloo"
        )
    d = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if d.type != "cuda":
        raise RuntimeError(f"{what} needs a cuda device, got {d}")
    return d


def node_ids(group: Any = None) -> list[str]:
    """Every rank's node id (hostname), indexed by global rank: ranks with equal ids can use IPC."""
    world = dist.get_world_size()
    out: list[Any] = [None] * world
    dist.all_gather_object(out, socket.gethostname(), group=group)
    return [str(x) for x in out]


def export(tensors: Mapping[str, torch.Tensor]) -> dict[str, Handle]:
    """IPC handles of ``tensors`` (CUDA tensors of this process)."""
    return {name: reduce_tensor(t) for name, t in tensors.items()}


def open_handles(handles: Mapping[str, Handle]) -> dict[str, torch.Tensor]:
    """Local views of a peer's tensors (opened once; torch caches the mapping per allocation)."""
    return {name: fn(*args) for name, (fn, args) in handles.items()}


def exchange(
    tensors: Mapping[str, torch.Tensor], *, wanted_from: set[int], group: Any = None
) -> dict[int, dict[str, torch.Tensor]]:
    """Collective: every rank exports ``tensors`` and opens those of the ranks in ``wanted_from``
    (global ranks, never itself). Returns peer -> name -> view of the peer's tensor."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, export(tensors) if tensors else {}, group=group)
    return {peer: open_handles(everyone[peer]) for peer in sorted(wanted_from)}
