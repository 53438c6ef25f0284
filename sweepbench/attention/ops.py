"""Block attention on one device through torch's own LSE-returning SDPA ops.

Every implementation computes attention as blocks (a slice of the queries against a slice of the
keys, fully or with a causal mask aligned at the top left, which is what the ops' ``is_causal``
means) and merges the blocks of the same query rows by their log-sum-exp, with fp32 math
(``accum``: the merge, and sums that skip fp32 passes where only two terms meet). A block's
backward is the op's backward called with the *merged* output and LSE, which makes it that
block's share of the gradient of the merged attention (the softmax over the union of keys).

The SDPA backends are registered by name: ``cpu_flash`` (the CPU flash op), and on CUDA ``cudnn``,
``flash`` and ``efficient``. A backend whose ops take fewer kv heads than query heads (GQA) says so
(``gqa``: cpu_flash, cuDNN and flash; measured on an H200, cuDNN's own GQA is 5-9% faster than the
expanded heads at 4K-8K, docs/results/attention_h200x1.md): K/V go to it as they are and its dK/dV come
back per kv head. For the others (efficient) the kv heads are expanded just before the op (after
any communication) and their gradients summed back. A backend whose ops read strided tensors
(``views``: cpu_flash, cuDNN and flash take any batch/head stride as long as each row is packed) is
handed a block's row slice of Q, K, V, out and dout as a view; the others get a contiguous copy.
The ring's zigzag blocks are such slices (half of the rows), so on the views backends a step
copies nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from sweepbench.attention.accum import Merged, RowSum, merge_
from sweepbench.attention.registry import SDPA_DEVICE
from sweepbench.core import Registry

aten = torch.ops.aten
Aux = tuple[Any, ...]


@dataclass(frozen=True)
class SdpaBackend:
    """``forward(q, k, v, causal, scale) -> (out, lse (B, H, Lq) fp32, aux)``;
    ``backward(dout, q, k, v, out, lse, aux, causal, scale) -> (dq, dk, dv)``; ``gqa``: the ops
    take K/V with fewer heads than Q (a divisor) and give dK/dV with those heads."""

    name: str
    device_type: str
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor, Aux]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    dtypes: tuple[torch.dtype, ...]
    gqa: bool = False
    views: bool = False


SDPA_BACKENDS: Registry[SdpaBackend] = Registry("SDPA backend", ordered=True)


def _register(backend: SdpaBackend) -> None:
    assert SDPA_DEVICE[backend.name] == backend.device_type, backend.name
    SDPA_BACKENDS.add(backend.name, backend)


def _cpu_fwd(q, k, v, causal, scale):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse.float(), ()


def _cpu_bwd(dout, q, k, v, out, lse, aux, causal, scale):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal, scale=scale)


def _cudnn_fwd(q, k, v, causal, scale):
    r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    lse, trailing = r[1], r[1].dim() == 4  # cuDNN may keep a trailing dim of 1: given back as it came
    return r[0], (lse.squeeze(-1) if trailing else lse).float(), (r[6], r[7], trailing)


def _cudnn_bwd(dout, q, k, v, out, lse, aux, causal, scale):
    seed, offset, trailing = aux
    return aten._scaled_dot_product_cudnn_attention_backward(
        dout,
        q,
        k,
        v,
        out,
        (lse.unsqueeze(-1) if trailing else lse).contiguous(),
        seed,
        offset,
        None,
        None,
        None,
        q.shape[2],
        k.shape[2],
        0.0,
        causal,
        scale=scale,
    )


def _flash_fwd(q, k, v, causal, scale):
    r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return r[0], r[1].float(), (r[2], r[3], r[6], r[7])


def _flash_bwd(dout, q, k, v, out, lse, aux, causal, scale):
    cum_q, cum_k, seed, offset = aux
    return aten._scaled_dot_product_flash_attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse.contiguous(),
        cum_q,
        cum_k,
        q.shape[2],
        k.shape[2],
        0.0,
        causal,
        seed,
        offset,
        scale=scale,
    )


def _rows_major(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) with (B, L, H, D) memory, the layout the efficient forward returns its output in."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _efficient_fwd(q, k, v, causal, scale):
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    return out, lse[..., : q.shape[2]].float(), (seed, offset)  # its LSE is padded to 32 rows


def _efficient_bwd(dout, q, k, v, out, lse, aux, causal, scale):
    seed, offset = aux
    # the kernel reads out and dout as (B, L, H, D) rows, as its forward lays out its output: given
    # (B, H, L, D) memory it computed wrong dq/dk and, at some shapes, read past the end of out (the
    # seed's dilated grid at 16K: an illegal memory access; see docs/results/attention_h200x1.md)
    out, dout = _rows_major(out), _rows_major(dout)
    pad = -q.shape[2] % 32
    lse = torch.nn.functional.pad(lse, (0, pad)).contiguous()
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
    )
    return dq, dk, dv


_LOW = (torch.bfloat16, torch.float16)
_register(SdpaBackend("cpu_flash", "cpu", _cpu_fwd, _cpu_bwd, (torch.float32, *_LOW), gqa=True, views=True))
_register(SdpaBackend("cudnn", "cuda", _cudnn_fwd, _cudnn_bwd, _LOW, gqa=True, views=True))
_register(SdpaBackend("flash", "cuda", _flash_fwd, _flash_bwd, _LOW, gqa=True, views=True))
_register(SdpaBackend("efficient", "cuda", _efficient_fwd, _efficient_bwd, (torch.float32, *_LOW)))


def get_backend(name: str) -> SdpaBackend:
    return SDPA_BACKENDS.get(name)


def backends_for(device_type: str, dtype: torch.dtype) -> list[str]:
    """The registered backends that can run on this device and dtype, in registry order."""
    return [b.name for b in SDPA_BACKENDS.values() if b.device_type == device_type and dtype in b.dtypes]


@dataclass(frozen=True)
class Block:
    """Queries ``q`` (a slice of the local query rows) against keys ``k`` (a slice of a key
    buffer); ``causal``: the top-left-aligned causal mask (q and k slices of equal length)."""

    q: slice
    k: slice
    causal: bool


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with its kv heads repeated to ``heads`` query heads (GQA); itself without GQA."""
    g = heads // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def rows_in(backend: SdpaBackend, x: torch.Tensor) -> torch.Tensor:
    """A (B, H, L, D) operand as ``backend``'s ops take it: itself where the backend takes views and
    its rows are packed (a row slice of a contiguous tensor, 16-byte aligned), else contiguous."""
    if backend.views and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] and x.data_ptr() % 16 == 0:
        return x
    return x.contiguous()


def kv_in(backend: SdpaBackend, x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V as ``backend``'s ops take it for ``heads`` query heads: as it is where the backend
    does GQA itself, else expanded; see ``rows_in``."""
    return rows_in(backend, x if backend.gqa else expand_kv(x, heads))


def _reduce(dx: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, h, l, d = dx.shape
    return dx if h == kv_heads else dx.view(b, kv_heads, h // kv_heads, l, d).sum(2)


def attend(
    backend: SdpaBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: Sequence[Block],
    *,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
    fresh: bool = False,
) -> Aux:
    """Merge ``blocks`` into the fp32 accumulators ``out`` (B, H, Lq, D) and ``lse`` (B, H, Lq);
    returns the aux tensors (RNG state) of the last op call, which a backward call needs.
    ``fresh``: the accumulators are empty and the blocks' rows disjoint, so the results are copied
    in (one pass instead of a merge's several: the ring's first step)."""
    aux: Aux = ()
    heads = q.shape[1]
    for b in blocks:
        o, l, aux = backend.forward(
            rows_in(backend, q[:, :, b.q]),
            kv_in(backend, k[:, :, b.k], heads),
            kv_in(backend, v[:, :, b.k], heads),
            b.causal,
            scale,
        )
        if fresh:
            out[:, :, b.q].copy_(o)
            lse[:, :, b.q].copy_(l)
        else:
            merge_(out[:, :, b.q], lse[:, :, b.q], o, l)
    return aux


def block_grads(
    backend: SdpaBackend,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    b: Block,
    *,
    scale: float,
    aux: Aux,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of dq (its query rows) and dk, dv (its keys, summed back to the kv heads)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    gq, gk, gv = backend.backward(
        rows_in(backend, dout[:, :, b.q]),
        rows_in(backend, q[:, :, b.q]),
        kv_in(backend, k[:, :, b.k], heads),
        kv_in(backend, v[:, :, b.k], heads),
        rows_in(backend, out[:, :, b.q]),
        lse[:, :, b.q].contiguous(),
        aux,
        b.causal,
        scale,
    )
    return gq, _reduce(gk, kv_heads), _reduce(gv, kv_heads)


def attend_backward(
    backend: SdpaBackend,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    blocks: Sequence[Block],
    *,
    scale: float,
    aux: Aux,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
) -> None:
    """Accumulate each block's gradients (from the merged ``out``/``lse``) into fp32 dq, dk, dv."""
    for b in blocks:
        gq, gk, gv = block_grads(backend, dout, q, k, v, out, lse, b, scale=scale, aux=aux)
        dq[:, :, b.q] += gq
        dk[:, :, b.k] += gk
        dv[:, :, b.k] += gv


def new_accumulators(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 output (zeros) and LSE (-inf) accumulators for the query rows of ``q``."""
    b, h, l, d = q.shape
    return (
        torch.zeros(b, h, l, d, dtype=torch.float32, device=q.device),
        torch.full((b, h, l), float("-inf"), dtype=torch.float32, device=q.device),
    )


def stash(
    ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, meta: Any
) -> torch.Tensor:
    """The end of an attention Function's forward: the fp32 output in q's dtype, saved for backward
    with q, k, v and the LSE, plus what else backward needs (``meta``)."""
    out = out.to(q.dtype)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.meta = meta
    return out


def unstash(ctx: Any) -> tuple[Any, ...]:
    """What :func:`stash` kept: q, k, v, out, lse, meta."""
    return (*ctx.saved_tensors, ctx.meta)


class LocalAttention(torch.autograd.Function):
    """Blocks over local q, k, v as one autograd node (single device; Ulysses' local step). One
    block covering everything (plain attention) costs the kernels and nothing else: its output
    and gradients are the kernels' own tensors (see ``accum``)."""

    @staticmethod
    def forward(ctx, q, k, v, backend: SdpaBackend, blocks: tuple[Block, ...], scale: float):
        merged, aux = Merged(q), ()
        for i, b in enumerate(blocks):
            o, lse, aux = backend.forward(
                rows_in(backend, q[:, :, b.q]),
                kv_in(backend, k[:, :, b.k], q.shape[1]),
                kv_in(backend, v[:, :, b.k], q.shape[1]),
                b.causal,
                scale,
            )
            merged.add(b.q, o, lse, last=i == len(blocks) - 1)
        return stash(ctx, q, k, v, *merged.result(), (backend, blocks, scale, aux))

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, (backend, blocks, scale, aux) = unstash(ctx)
        dout = dout.contiguous()
        sums = [RowSum(x.shape, device=x.device) for x in (q, k, v)]
        for b in blocks:
            for s, rows, g in zip(
                sums, (b.q, b.k, b.k), block_grads(backend, dout, q, k, v, out, lse, b, scale=scale, aux=aux)
            ):
                s.add(rows, g)
        return (*(s.result(x.dtype) for s, x in zip(sums, (q, k, v))), None, None, None)


def full_blocks(seq_len: int, causal: bool) -> tuple[Block, ...]:
    """One block: the whole (local) sequence against itself."""
    return (Block(slice(0, seq_len), slice(0, seq_len), causal),)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: str, causal: bool, scale: float
) -> torch.Tensor:
    """Plain attention on one device through ``backend`` (autograd-aware)."""
    return LocalAttention.apply(q, k, v, get_backend(backend), full_blocks(q.shape[2], causal), scale)
