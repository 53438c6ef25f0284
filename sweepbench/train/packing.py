"""Padding-free batches: variable-length documents packed into one sequence, positions restarting
at each document and attention never crossing a document's boundary.

A packed batch travels as ``[B, 2, S]`` int64: tokens, then each token's position within its
document (0 starts a document), so the engine's row slicing (dp ranks, micro-batches) keeps them
together. The model's forward pre-hook (:func:`apply_padding_free`) joins a micro-batch's rows
into one sequence of B*S tokens, sets RoPE's positions, and hands the attention a document
kernel: SDPA with a block-diagonal causal mask, or on CUDA torch's varlen flash attention over the
documents' offsets (no mask). Targets are ``[B, S]`` with -100 where a row's tail is padding;
the loss is the mean over real tokens, and tokens/s counts real tokens only.

Verified against the documents run one by one (:func:`check_documents`): the packed forward's
summed loss must equal the sum of each document's own loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweepbench.train.data import SyntheticTask
from sweepbench.train.model import Attention, sdpa_attention

IGNORE = -100


class PackedTask:
    """Step s's global batch: documents of ``seq_len/8`` to ``seq_len/2`` tokens (seeded by step),
    each a walk of the synthetic task's cycle, packed greedily into rows of ``seq_len``; a row's
    tail that no next document fits is padding (token 0, target -100, a document of its own)."""

    def __init__(self, task: SyntheticTask, *, vocab_size: int) -> None:
        self.task, self.vocab_size = task, vocab_size
        self.seq_len, self.global_batch, self.seed = task.seq_len, task.global_batch, task.seed
        self._real: dict[int, int] = {}

    def documents(self, step: int) -> list[list[torch.Tensor]]:
        """Step ``step``'s documents, row by row as packed: each a walk of ``n + 1`` tokens (inputs
        ``walk[:-1]``, targets ``walk[1:]``)."""
        s, cycle = self.seq_len, self.task.cycle
        gen = torch.Generator().manual_seed(self.seed * 104729 + step + 1)
        lo, hi = max(1, s // 8), max(2, s // 2)
        rows = []
        for _ in range(self.global_batch):
            at, row = 0, []
            while True:
                n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
                if at + n > s:
                    break
                start = int(torch.randint(0, len(cycle), (1,), generator=gen))
                row.append(cycle[(start + torch.arange(n + 1)) % len(cycle)])
                at += n
            rows.append(row)
        return rows

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.seq_len
        tokens = torch.zeros(self.global_batch, s, dtype=torch.long)
        positions = torch.zeros_like(tokens)
        targets = torch.full_like(tokens, IGNORE)
        for row, docs in enumerate(self.documents(step)):
            at = 0
            for walk in docs:
                n = len(walk) - 1
                tokens[row, at : at + n], targets[row, at : at + n] = walk[:-1], walk[1:]
                positions[row, at : at + n] = torch.arange(n)
                at += n
            positions[row, at:] = torch.arange(s - at)  # the padding: one document of its own
        self._real[step] = int((targets != IGNORE).sum())
        return torch.stack((tokens, positions), dim=1), targets

    def real_tokens(self, step: int) -> int:
        """Tokens with a target in step ``step``'s global batch (padding excluded)."""
        if step not in self._real:
            self.batch(step)
        return self._real[step]


class PaddedTask(PackedTask):
    """The padded baseline of :class:`PackedTask`: the same step's documents, the first
    ``global_batch`` of them in packing order, one per row from position 0, its tail padding
    (token 0, target -100) to ``seq_len``; a plain ``[B, S]`` batch under the causal mask (the
    padding after a document cannot reach it). Tokens/s counts real tokens, as packed."""

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        docs = [walk for row in self.documents(step) for walk in row][: self.global_batch]
        assert len(docs) == self.global_batch  # every packed row holds at least one document
        tokens = torch.zeros(self.global_batch, self.seq_len, dtype=torch.long)
        targets = torch.full_like(tokens, IGNORE)
        for row, walk in enumerate(docs):
            tokens[row, : len(walk) - 1], targets[row, : len(walk) - 1] = walk[:-1], walk[1:]
        self._real[step] = int((targets != IGNORE).sum())
        return tokens, targets


@dataclass
class Documents:
    """The documents of the sequence the model runs now (set by the forward pre-hook)."""

    offsets: torch.Tensor | None = None  # [num_docs + 1] int32, cumulative starts
    doc_ids: torch.Tensor | None = None  # [T] document index of each token
    max_len: int = 0


def _doc_starts(positions: torch.Tensor) -> torch.Tensor:
    starts = positions == 0
    starts[0] = True
    return starts


def masked_sdpa(docs: Documents) -> Callable[..., torch.Tensor]:
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ids = docs.doc_ids
        assert ids is not None, "set by the forward pre-hook"
        t = ids.numel()
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        mask = causal & (ids[:, None] == ids[None, :])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=q.shape[1] != k.shape[1])

    return attn


def varlen_flash(docs: Documents) -> Callable[..., torch.Tensor]:
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    # causal: torch >= 2.11 says so as a (left, right) window; earlier releases had is_causal
    causal: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    gqa = "enable_gqa" in params
    masked = masked_sdpa(docs)

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.dtype not in (torch.bfloat16, torch.float16):  # flash kernels take half precision only
            return masked(q, k, v)
        # [1, H, T, D] -> [T, H, D]
        q1, k1, v1 = (x[0].transpose(0, 1) for x in (q, k, v))
        extra: dict[str, Any] = dict(causal)
        if k1.shape[1] != q1.shape[1]:
            if gqa:
                extra["enable_gqa"] = True
            else:  # K/V heads repeated for a varlen_attn without GQA
                rep = q1.shape[1] // k1.shape[1]
                k1, v1 = k1.repeat_interleave(rep, dim=1), v1.repeat_interleave(rep, dim=1)
        offsets = docs.offsets
        assert offsets is not None, "set by the forward pre-hook"
        out = varlen_attn(
            q1.contiguous(),
            k1.contiguous(),
            v1.contiguous(),
            offsets,
            offsets,
            docs.max_len,
            docs.max_len,
            **extra,
        )
        assert isinstance(out, torch.Tensor)
        return out.transpose(0, 1)[None]

    return attn


def kernel_name(device: torch.device) -> str:
    """varlen flash attention on CUDA where torch has it (bf16/fp16 weights), else masked SDPA."""
    if device.type == "cuda":
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401

            return "varlen"
        except ImportError:
            pass
    return "sdpa_mask"


KERNELS = {"sdpa_mask": masked_sdpa, "varlen": varlen_flash}


def apply_padding_free(model: nn.Module, *, kernel: str) -> None:
    """Make ``model`` (a whole Transformer) take packed ``[B, 2, S]`` batches (see module doc)."""
    docs = Documents()
    attn = KERNELS[kernel](docs)
    for att in [m for m in model.modules() if isinstance(m, Attention)]:  # through checkpoint wrappers
        att.attn_fn = attn

    def pre_hook(module: nn.Module, args: tuple) -> tuple:
        x, *rest = args  # rest: the targets, where the fused loss takes them (fused=liger)
        if x.dim() != 3:
            return args
        tokens, positions = x[:, 0].reshape(1, -1), x[:, 1].reshape(-1)
        starts = _doc_starts(positions)
        docs.doc_ids = starts.cumsum(0) - 1
        idx = torch.nonzero(starts).flatten()
        offsets = torch.cat((idx, idx.new_tensor([positions.numel()])))
        docs.offsets = offsets.to(torch.int32)
        docs.max_len = int((offsets[1:] - offsets[:-1]).max())
        module.positions = positions
        return (tokens, *rest)

    model.register_forward_pre_hook(pre_hook)


@torch.no_grad()
def check_documents(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, rtol: float) -> float:
    """The packed forward of the first row against its documents run one by one (plain causal
    attention, positions from 0): summed token losses must agree within ``rtol``; returns the
    relative error. Restores the model's positions afterwards."""
    x, y = inputs[:1], targets[:1]
    packed = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten(), reduction="sum")
    positions = x[0, 1]
    starts = torch.nonzero(_doc_starts(positions.clone())).flatten().tolist() + [positions.numel()]
    saved = [(m, m.attn_fn) for m in model.modules() if isinstance(m, Attention)]

    total = torch.zeros((), device=x.device)
    try:
        for b, _ in saved:
            b.attn_fn = sdpa_attention
        for a, e in pairwise(starts):
            model.positions = torch.arange(e - a, device=x.device)
            logits = model(x[:, 0, a:e])
            total += F.cross_entropy(logits.flatten(0, 1).float(), y[0, a:e], reduction="sum", ignore_index=IGNORE)
    finally:
        for b, fn in saved:
            b.attn_fn = fn
    err = abs(float(packed) - float(total)) / max(abs(float(total)), 1e-12)
    if not err <= rtol:
        from sweepbench.core import VerificationError

        raise VerificationError(
            f"padding-free: the packed row's summed loss {float(packed):.6f} differs from its "
            f"{len(starts) - 1} documents run one by one ({float(total):.6f}) by {err:.2e} "
            f"(tolerance {rtol:.0e})"
        )
    return err
