"""Fused kernels as a recipe knob: ``fused=liger`` runs liger-kernel's Triton kernels in our decoder,
as fms-acceleration's fused-ops plugin does in an HF model: SwiGLU's silu(a)*b, RoPE, and the fused
linear cross-entropy (the output projection and the loss in chunks: the [tokens, vocab] logits are
never materialised; see :func:`chunk_mem_const` for the chunks' size; its backward without a host
synchronisation). Each residual add and the RMSNorm that reads its sum are one Triton kernel each
way (``add_norm_kernel``; the blocks pass the stream on as a residual and an update not yet added,
:class:`FusedTransformer`): liger's RMSNorm and its fused add + RMSNorm measured slower than torch's
pair on an H200, forward and backward, at the 1B and 7B shapes, the weight trained or frozen
(``bench/gpu/step_parts.py --only add_norm``: liger's backward runs one program per SM, each over
its share of the rows in sequence). Under LoRA the norm before attention writes its rows with spare
columns past their ends, where q, k and v's LoRA layers put x A^T, so that each of them is one GEMM
over [x | x A^T] with its widened weight [W | s B] (``model.lora_room``), and the output
projection's update s (x A^T) B^T is added inside the add + norm kernel that reads the projection's
output (:func:`add_projected_norm`): no low-rank product is written apart and read again.

Liger's RoPE rotates HF's rotate-half pairs (i, i+D/2) where ours rotates interleaved pairs
(2i, 2i+1); :func:`apply` reorders the rows of each head of wq and wk (and their LoRA B) once,
after initialisation, so the fused model computes the same function as the unfused one (q.k is
unchanged by reordering both alike). The first steps are verified against the unfused model.
Liger's kernels need Triton on CUDA."""

from __future__ import annotations

from typing import Any

import torch

from torch import nn

from sweepbench.train.model import (
    Attention,
    Block,
    FeedForward,
    LoRALinear,
    Transformer,
    eager_plain,
    frozen_group,
    lora_room,
    lora_split,
)

# rows of a loss chunk that keep its GEMMs efficient: the input's gradient of a chunk is a
# [rows, hidden] product over the whole vocabulary, a single wave of tiles at 2048 rows on a GPU of
# about 132 SMs; at 512 rows it needs split-K, and a trained output weight's gradient is read and
# written once a chunk
CHUNK_ROWS = 2048


def to_rotate_half(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of a q/k projection (or its LoRA B) from interleaved RoPE pairs to rotate-half pairs."""
    out, rest = w.shape[0], w.shape[1:]
    return w.reshape(out // head_dim, head_dim // 2, 2, *rest).transpose(1, 2).reshape(out, *rest)


class LigerRope:
    """liger's RoPE as an attention's ``rope_fn``: q, k: [B, S, H, D]; cos/sin: [S, D/2] (ours),
    made liger's [S, D] rotate-half tables once per tables and dtype (one instance serves every
    layer: their tables are the same tensors), where each layer made its own each step."""

    def __init__(self) -> None:
        self._kept: tuple[torch.Tensor, torch.dtype, tuple[torch.Tensor, torch.Tensor]] | None = None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from liger_kernel.transformers.functional import liger_rope as rope

        def make() -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat((cos, cos), dim=-1).to(q.dtype), torch.cat((sin, sin), dim=-1).to(q.dtype)

        if torch.compiler.is_compiling():  # a compiled graph makes them in its own kernels
            tables = make()
        else:
            if self._kept is None or self._kept[0] is not cos or self._kept[1] != q.dtype:
                self._kept = (cos, q.dtype, make())
            tables = self._kept[2]
        q2, k2 = rope(q.transpose(1, 2), k.transpose(1, 2), *tables)
        return q2.transpose(1, 2), k2.transpose(1, 2)


class LigerFeedForward(FeedForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from liger_kernel.transformers.functional import liger_swiglu

        return self.w2(liger_swiglu(*frozen_group(x, [self.w1, self.w3])))


def add_norm(
    residual: torch.Tensor, update: torch.Tensor, norm: nn.Module, *, room: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + update), residual + update), ``norm`` an nn.RMSNorm: one Triton kernel each
    way for plain CUDA tensors in eager steps (``add_norm_kernel.AddRMSNorm``, the norm's rows
    ``room`` columns wider, spare for its reader), torch's ops otherwise (under torch.compile
    Inductor fuses them itself; a DTensor, autocast)."""
    eps = _kernel_eps(residual, norm)
    if eps is not None and eager_plain(update):
        from sweepbench.train.add_norm_kernel import AddRMSNorm

        return AddRMSNorm.apply(residual, update, norm.weight, eps, room)
    total = residual + update
    return norm(total), total


def add_projected_norm(
    residual: torch.Tensor, x: torch.Tensor, proj: nn.Module, norm: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_norm(residual, proj(x), norm)``; where ``proj`` is a LoRA layer and the add + norm runs as
    the Triton kernel, its low-rank update s (x A^T) B^T is added inside that kernel
    (``add_norm_kernel.AddLoRARMSNorm``, the layer's two products by ``model.lora_split``), never
    written as its own [tokens, width] product and read back."""
    eps = _kernel_eps(residual, norm)
    split = lora_split(x, proj) if eps is not None else None
    if split is not None:
        from sweepbench.train.add_norm_kernel import AddLoRARMSNorm

        return AddLoRARMSNorm.apply(residual, *split, proj.lora_b, norm.weight, eps, proj.scale)
    return add_norm(residual, proj(x), norm)


def _kernel_eps(residual: torch.Tensor, norm: nn.Module) -> float | None:
    """The norm's epsilon where the add + norm may run as the Triton kernels (a plain CUDA stream in
    an eager step, the norm's weight a plain tensor), else None (torch's ops)."""
    if not (residual.is_cuda and eager_plain(residual) and type(norm.weight.data) is torch.Tensor):
        return None
    eps: float | None = getattr(norm, "eps", None)  # nn.RMSNorm's: None for its dtype's epsilon
    return eps if eps is not None else torch.finfo(residual.dtype).eps


class FusedBlock(Block):
    """The block on a residual stream passed on as (residual, update), not yet added: each residual
    add is one kernel with the RMSNorm that reads its sum (:func:`add_norm`). ``update`` None: ``x``
    is the whole stream (the first block of a stage)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, update: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if update is None:
            n = self.attention_norm(x)
        else:
            n, x = add_norm(x, update, self.attention_norm, room=self.attention.input_room)
        n, h = add_projected_norm(x, self.attention.attend(n, cos, sin), self.attention.wo, self.ffn_norm)
        return h, self.feed_forward(n)


class FusedTransformer(Transformer):
    """The decoder over :class:`FusedBlock` s: the last update added by the final norm's
    :func:`add_norm` (by a plain add on a stage without it)."""

    def run_blocks(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        update = None
        for layer in self.layers.values():
            h, update = layer(h, cos, sin, update)
        if update is None:  # no blocks: the plain decoder's final norm
            return super().run_blocks(h, cos, sin)
        return add_norm(h, update, self.norm)[0] if self.norm is not None else h + update


def chunk_mem_const(tokens: int, hidden: int, vocab: int) -> int:
    """liger's ``chunk_mem_const`` (a chunk's logits hold at most about that many times tokens x
    hidden elements) for chunks of :data:`CHUNK_ROWS` rows where the vocabulary is large against the
    hidden size (liger's default, 1, gives 512-row chunks at hidden 2048 and vocabulary 128256): a
    constant whose chunks reach that many rows, or cover the tokens; 1 where liger's already do."""
    chunks = -(-tokens // CHUNK_ROWS)  # how many chunks of CHUNK_ROWS rows the tokens fill
    return max(1, -(-vocab // (hidden * chunks)))


class _FusedLoss(torch.autograd.Function):
    """liger's fused linear cross-entropy: its forward computes the loss and, chunk by chunk, the
    gradients of the input (and of the output weight where it trains); the backward scales them by
    the incoming gradient on the device. liger's own backward first compares that gradient with 1.0
    on the host, a synchronisation that left the GPU idle at the start of every backward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, const: int) -> torch.Tensor:
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward

        out = fused_linear_cross_entropy_forward(h, weight, targets, chunk_mem_const=const)
        loss, grad_input, grad_weight = out[0], out[-3], out[-2]  # (loss, ..., grad_input, grad_weight, grad_bias)
        ctx.save_for_backward(grad_input, grad_weight)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input.mul_(grad), grad_weight.mul_(grad) if grad_weight is not None else None, None, None


def fused_cross_entropy(weight: torch.Tensor, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token loss of ``h @ weight^T`` against ``targets`` without the logits (-100 ignored)."""
    rows = h.flatten(0, 1)
    const = chunk_mem_const(rows.shape[0], rows.shape[1], weight.shape[0])
    return _FusedLoss.apply(rows, weight, targets.flatten(), const)


@torch.no_grad()
def apply(model: Transformer, fused: str) -> None:
    """``fused=liger``: swap in liger's kernels (after the weights are initialised, before FSDP/DDP)."""
    assert fused == "liger", fused
    hd = model.shape.head_dim
    for ffn in [m for m in model.modules() if isinstance(m, FeedForward)]:
        ffn.__class__ = LigerFeedForward
    for block in [m for m in model.modules() if type(m) is Block]:
        block.__class__ = FusedBlock
    if type(model) is Transformer:
        model.__class__ = FusedTransformer
    rope = LigerRope()
    for att in [m for m in model.modules() if isinstance(m, Attention)]:
        att.rope_fn = rope
        for proj in (att.wq, att.wk):
            proj.weight.copy_(to_rotate_half(proj.weight, hd))
            if isinstance(proj, LoRALinear):
                proj.lora_b.copy_(to_rotate_half(proj.lora_b, hd))
        att.input_room = lora_room([att.wq, att.wk, att.wv])
    if model.output is not None:
        model.fused_loss = fused_cross_entropy
