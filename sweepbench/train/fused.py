"""Fused kernels as a recipe knob: ``fused=liger`` runs liger-kernel's Triton kernels in our decoder,
as fms-acceleration's fused-ops plugin does in an HF model: RMSNorm (each residual add and the
RMSNorm that reads its sum as one fused add + RMSNorm kernel, the stream carried between blocks as
(residual, update)), SwiGLU's silu(a)*b, RoPE, and the fused linear cross-entropy (the output
projection and the loss in chunks: the [tokens, vocab] logits are never materialised; see
:func:`chunk_mem_const` for the chunks' size; its backward without a host synchronisation).

Liger's RoPE rotates HF's rotate-half pairs (i, i+D/2) where ours rotates interleaved pairs
(2i, 2i+1); :func:`apply` reorders the rows of each head of wq and wk (and their LoRA B) once,
after initialisation, so the fused model computes the same function as the unfused one (q.k is
unchanged by reordering both alike). The first steps are verified against the unfused model.
Liger needs Triton on CUDA (its RMSNorm does not run under Triton's CPU interpreter)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweepbench.train.model import Attention, Block, FeedForward, LoRALinear, Transformer, frozen_group

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


class LigerBlock(Block):
    """The block on a residual stream carried as (residual, update): each residual add is liger's
    fused add + RMSNorm with the norm that reads its sum (forward: the sum and its norm in one kernel;
    backward: the norm's gradient plus the residual's). Returns (residual, update) for the next block
    (:class:`LigerTransformer`) to add; ``update`` None: ``x`` is the whole stream (the first block)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, update: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if update is None:
            n = plain_norm(x, self.attention_norm)
        else:
            n, x = add_norm(update, x, self.attention_norm)
        n, h = add_norm(self.attention(n, cos, sin), x, self.ffn_norm)
        return h, self.feed_forward(n)


def plain_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``norm(x)``, ``norm`` a LigerRMSNorm: liger's kernel in eager steps, torch's op under torch.compile."""
    if torch.compiler.is_compiling():
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm(x)


def add_norm(update: torch.Tensor, residual: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + update), residual + update), ``norm`` a LigerRMSNorm: in eager steps liger's
    fused add + RMSNorm forward with torch's RMSNorm backward (:class:`_AddNorm`); under torch.compile
    the plain ops, which Inductor fuses itself."""
    if torch.compiler.is_compiling():
        total = residual + update
        return F.rms_norm(total, (total.shape[-1],), norm.weight, norm.variance_epsilon), total
    return _AddNorm.apply(update, residual, norm.weight, norm.variance_epsilon)


class _AddNorm(torch.autograd.Function):
    """Forward: liger's fused add + RMSNorm (the sum and its norm in one kernel, liger's Llama
    casting: the inverse RMS in fp32). Backward: torch's fused RMSNorm backward over the saved sum and
    inverse RMS (no weight gradient where the weight is frozen), plus the sum's own gradient: the
    input and the residual get the same gradient. liger's backward runs one program per SM, each over
    its share of the rows in sequence, about three times as long as a pass over the tensors takes
    (measured: ``bench/gpu/step_parts.py --only add_norm``)."""

    @staticmethod
    def forward(
        ctx: Any, update: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

        update, residual = update.contiguous(), residual.contiguous()  # (no copy where they already are)
        out, total, rstd, *_ = fused_add_rms_norm_forward(update, residual, weight, eps, 0.0, "llama")
        ctx.save_for_backward(total, weight, rstd)
        ctx.set_materialize_grads(False)
        return out, total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_total: torch.Tensor | None) -> tuple[Any, ...]:
        total, weight, rstd = ctx.saved_tensors
        grad_weight = None
        if grad_out is None:
            grad = grad_total
        else:
            shape = total.shape
            grad, grad_weight = torch.ops.aten._fused_rms_norm_backward(
                grad_out, total, [shape[-1]], rstd.view(*shape[:-1], 1), weight, [True, ctx.needs_input_grad[2]]
            )
            if grad_total is not None:
                grad = grad.add_(grad_total)
        return grad, grad, grad_weight, None


class LigerTransformer(Transformer):
    """The decoder over :class:`LigerBlock` s: the stream passed between blocks as (residual, update),
    the last update added by the final norm's fused add + RMSNorm."""

    def run_blocks(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        update = None
        for layer in self.layers.values():
            h, update = layer(h, cos, sin, update)
        if update is None:
            return self.norm(h) if self.norm is not None else h
        return add_norm(update, h, self.norm)[0] if self.norm is not None else h + update


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
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    hd = model.shape.head_dim
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.RMSNorm):
                norm = LigerRMSNorm(child.weight.shape[0], eps=child.eps).to(child.weight.device, child.weight.dtype)
                norm.weight.copy_(child.weight)
                norm.weight.requires_grad_(child.weight.requires_grad)
                setattr(module, name, norm)
    for ffn in [m for m in model.modules() if isinstance(m, FeedForward)]:
        ffn.__class__ = LigerFeedForward
    for block in [m for m in model.modules() if type(m) is Block]:
        block.__class__ = LigerBlock
    if type(model) is Transformer:
        model.__class__ = LigerTransformer
    rope = LigerRope()
    for att in [m for m in model.modules() if isinstance(m, Attention)]:
        att.rope_fn = rope
        for proj in (att.wq, att.wk):
            proj.weight.copy_(to_rotate_half(proj.weight, hd))
            if isinstance(proj, LoRALinear):
                proj.lora_b.copy_(to_rotate_half(proj.lora_b, hd))
    if model.output is not None:
        model.fused_loss = fused_cross_entropy
