"""CUDA IPC between the ranks of one node: export a rank's tensors once, open its peers' tensors
as local views of their memory, and find which ranks share a node.

A peer's tensor opened here is the peer's own memory (no copy): a ``copy_`` out of it is a
device-to-device transfer over NVLink or PCIe, which CUDA runs on a copy engine when both sides
are contiguous. Where one side is a 2D region (rows of contiguous bytes at a fixed pitch, as a
column slice of a weight is), ``copy_2d`` hands it to the copy engine as one ``cudaMemcpy2DAsync``,
where torch's ``copy_`` would launch an elementwise kernel. Handles come from ``torch.multiprocessing.reductions.reduce_tensor`` (the
mechanism torch.multiprocessing uses to pass CUDA tensors between processes); they are picklable,
so they travel through ``all_gather_object``. The exporting rank must keep its tensors alive (and
at the same address) for as long as peers use the views.
"""

from __future__ import annotations

import ctypes
import functools
import os
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


Plane = tuple[int, int, int]  # (pitch, width, height): rows of ``width`` bytes, each ``pitch`` bytes after the last


def plane(t: torch.Tensor) -> Plane | None:
    """``t``'s memory as a 2D region in bytes, or None where it is not one (its last dim strided,
    or strided in more than one place). A contiguous tensor is one row: (n, n, 1)."""
    size = t.element_size()
    dims = [(n, s) for n, s in zip(t.shape, t.stride()) if n != 1]
    i, width = len(dims) - 1, 1
    while i >= 0 and dims[i][1] == width:  # the innermost dims that lie end to end: one row
        width *= dims[i][0]
        i -= 1
    if i < 0:
        return width * size, width * size, 1
    if width == 1:
        return None
    height, pitch = dims[i]
    i -= 1
    while i >= 0 and dims[i][1] == height * pitch:  # the outer dims that step by whole rows
        height *= dims[i][0]
        i -= 1
    return None if i >= 0 or pitch < width else (pitch * size, width * size, height)


def planes(dst: torch.Tensor, src: torch.Tensor) -> tuple[Plane, Plane] | None:
    """The two sides of one 2D copy (same width and height), or None where no single
    ``cudaMemcpy2D`` copies ``src`` into ``dst``."""
    d, s = plane(dst), plane(src)
    if d is None or s is None or dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    strided = d if d[2] > 1 else s  # a contiguous side takes the other's rows, at a pitch of one row
    _, width, height = strided
    as_rows = [p if p[2] > 1 else (width, width, height) for p in (d, s)]
    return (as_rows[0], as_rows[1]) if all(p[1:] == (width, height) for p in as_rows) else None


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime this process's torch loaded."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libcudart.so"):
                return ctypes.CDLL(path)
    return ctypes.CDLL(f"libcudart.so.{(torch.version.cuda or '').split('.')[0]}")


def copy_2d(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """``dst.copy_(src)`` as one ``cudaMemcpy2DAsync`` on ``stream`` (on ``stream``'s device,
    either side on any GPU this process can reach); ValueError where ``planes`` finds no such copy."""
    sides = planes(dst, src)
    if sides is None:
        raise ValueError(
            f"no single 2D copy from shape {tuple(src.shape)} strides {src.stride()} to strides {dst.stride()}"
        )
    (dpitch, width, height), (spitch, _, _) = sides
    rt = _cudart()
    with torch.cuda.device(stream.device):
        err = rt.cudaMemcpy2DAsync(
            ctypes.c_void_p(dst.data_ptr()),
            ctypes.c_size_t(dpitch),
            ctypes.c_void_p(src.data_ptr()),
            ctypes.c_size_t(spitch),
            ctypes.c_size_t(width),
            ctypes.c_size_t(height),
            ctypes.c_int(4),  # cudaMemcpyDefault: unified addressing says which device each side is on
            ctypes.c_void_p(stream.cuda_stream),
        )
    if err:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"cudaMemcpy2DAsync failed: {rt.cudaGetErrorString(err).decode()} (error {err})")
