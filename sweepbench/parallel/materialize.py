"""Deterministic shard contents and bit-exact verification.

Element ``i`` (flat index in the *full* tensor) of parameter ``name`` has value
``(h(seed, name, i) % 255 - 127) / 64`` for a cheap integer hash ``h``: every rank
can compute any slice of any parameter without materialising the full tensor, and
the values are exact in float32, bfloat16 and float16 (8 significant bits, small
exponent), so transfers can be checked bit for bit.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Mapping

import torch

from .boxes import Box, box_shape, box_slices
from .layout import Layout
from .specs import torch_dtype

_M31 = (1 << 31) - 1
_MUL = 0x45D9F3B
CHUNK_ELEMS = 1 << 24  # bound on temporaries while generating values


def _mix(x: int) -> int:
    """31-bit integer hash (x < 2**31); int64 tensor arithmetic never overflows (_MUL < 2**27)."""
    for _ in range(2):
        x = ((x >> 16) ^ x) * _MUL & _M31
    return (x >> 16) ^ x


def _mix_(x: torch.Tensor) -> torch.Tensor:
    """``_mix`` in place on an int64 tensor of values < 2**31."""
    for _ in range(2):
        x.bitwise_xor_(x >> 16).mul_(_MUL).bitwise_and_(_M31)
    return x.bitwise_xor_(x >> 16)


def _salt(seed: int, name: str) -> int:
    return _mix((int(seed) * 0x9E3779B1 ^ zlib.crc32(name.encode())) & _M31)


def _values(shape: tuple[int, ...], box: Box, salt: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """value = (mix((i & M31) ^ mix((i >> 31) ^ salt)) % 255 - 127) / 64 for flat index i."""
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    x = torch.zeros(box_shape(box), dtype=torch.int64, device=device)
    for d, (a, b) in enumerate(box):
        view = [1] * len(box)
        view[d] = b - a
        x.add_(torch.arange(a * strides[d], b * strides[d], strides[d], dtype=torch.int64, device=device).view(view))
    last = sum((b - 1) * st for (_, b), st in zip(box, strides))
    if last <= _M31:  # i >> 31 == 0 everywhere: the inner mix is one constant
        x.bitwise_xor_(_mix(salt))
    else:
        x = (x & _M31).bitwise_xor_(_mix_((x >> 31).bitwise_xor_(salt)))
    h = _mix_(x)
    return h.remainder_(255).sub_(127).to(torch.float32).div_(64).to(dtype)


def fill_box(out: torch.Tensor, shape: tuple[int, ...], global_box: Box, *, seed: int, name: str) -> None:
    """Write the values of ``global_box`` of the full tensor (``shape``) into ``out``
    (a tensor of the box's shape), in chunks of at most ~CHUNK_ELEMS elements."""
    salt = _salt(seed, name)
    ext = box_shape(global_box)
    if not ext:
        out.copy_(_values(shape, global_box, salt, out.dtype, out.device))
        return
    # the first dim d whose trailing block fits in a chunk: loop over dims < d, chunk dim d
    d = next(i for i in range(len(ext)) if math.prod(ext[i + 1 :]) <= CHUNK_ELEMS)
    step = max(1, CHUNK_ELEMS // max(1, math.prod(ext[d + 1 :])))
    for head in itertools.product(*(range(n) for n in ext[:d])):
        for lo in range(0, ext[d], step):
            hi = min(ext[d], lo + step)
            gbox = tuple((global_box[i][0] + j, global_box[i][0] + j + 1) for i, j in enumerate(head))
            gbox += ((global_box[d][0] + lo, global_box[d][0] + hi),) + global_box[d + 1 :]
            local = tuple(slice(j, j + 1) for j in head) + (slice(lo, hi),)
            out[local].copy_(_values(shape, gbox, salt, out.dtype, out.device))


def expected_shard(
    layout: Layout,
    rank: int,
    name: str,
    *,
    seed: int,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """The exact local shard of ``name`` that ``rank`` holds under ``layout``."""
    spec = layout.param(name)
    info = layout.shards(rank).get(name)
    if info is None:
        raise ValueError(f"rank {rank} holds no part of {name!r} in {layout.describe()}")
    out = torch.empty(info.local_shape, dtype=torch_dtype(dtype or spec.dtype), device=device)
    for piece in info.pieces:
        fill_box(out[box_slices(piece.local_box)], spec.shape, piece.global_box, seed=seed, name=name)
    return out


def build_shards(
    layout: Layout,
    rank: int,
    *,
    seed: int,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """param name -> deterministic local shard for every param ``rank`` holds (dtype
    defaults to each param's own dtype)."""
    return {
        name: expected_shard(layout, rank, name, seed=seed, dtype=dtype, device=device) for name in layout.shards(rank)
    }


def allocate_shards(
    layout: Layout,
    rank: int,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    fill: float | None = None,
) -> dict[str, torch.Tensor]:
    """Destination buffers for ``rank`` (uninitialised, or filled with ``fill``, e.g. nan)."""
    out = {}
    for name, info in layout.shards(rank).items():
        dt = torch_dtype(dtype or layout.param(name).dtype)
        t = torch.empty(info.local_shape, dtype=dt, device=device)
        out[name] = t if fill is None else t.fill_(fill)
    return out


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    iv = _INT_VIEW[a.element_size()]
    return bool(torch.equal(a.contiguous().view(iv), b.contiguous().view(iv)))


def verify_shards(layout: Layout, rank: int, shards: Mapping[str, torch.Tensor], *, seed: int) -> list[str]:
    """Bit-exact check of ``rank``'s shards against the expected slices of the source
    weights; returns one line per problem (empty list = all good)."""
    problems = []
    expected_names = set(layout.shards(rank))
    for name in sorted(expected_names ^ set(shards)):
        problems.append(f"rank {rank}: {name!r} {'missing' if name in expected_names else 'unexpected'}")
    for name in sorted(expected_names & set(shards)):
        got = shards[name]
        want = expected_shard(layout, rank, name, seed=seed, dtype=got.dtype, device=got.device)
        if not bit_equal(got, want):
            bad = int((got.float() != want.float()).sum()) if got.shape == want.shape else -1
            problems.append(
                f"rank {rank}: {name!r} differs ({bad} of {want.numel()} elements, shape {tuple(got.shape)})"
            )
    return problems
