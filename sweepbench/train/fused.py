"""Fused kernels as a recipe knob: ``fused=liger`` runs liger-kernel's Triton kernels in our decoder,
as fms-acceleration's fused-ops plugin does in an HF model: RMSNorm (in each block, the attention's
residual add and the feed-forward's RMSNorm as one kernel), SwiGLU's silu(a)*b, RoPE, and the fused
linear cross-entropy (the output projection and the loss in chunks: the [tokens, vocab] logits are
never materialised; see :func:`chunk_mem_const` for the chunks' size).

Liger's RoPE rotates HF's rotate-half pairs (i, i+D/2) where ours rotates interleaved pairs
(2i, 2i+1); :func:`apply` reorders the rows of each head of wq and wk (and their LoRA B) once,
after initialisation, so the fused model computes the same function as the unfused one (q.k is
unchanged by reordering both alike). The first steps are verified against the unfused model.
Liger needs Triton on CUDA (its RMSNorm does not run under Triton's CPU interpreter)."""

from __future__ import annotations

import torch
from torch import nn

from sweepbench.train.model import Attention, Block, FeedForward, LoRALinear, Transformer

# rows of a loss chunk that keep its GEMMs efficient: the input's gradient of a chunk is a
# [rows, hidden] product over the whole vocabulary, a single wave of tiles at 2048 rows on a GPU of
# about 132 SMs; at 512 rows it needs split-K, and a trained output weight's gradient is read and
# written once a chunk
CHUNK_ROWS = 2048


def to_rotate_half(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of a q/k projection (or its LoRA B) from interleaved RoPE pairs to rotate-half pairs."""
    out, rest = w.shape[0], w.shape[1:]
    return w.reshape(out // head_dim, head_dim // 2, 2, *rest).transpose(1, 2).reshape(out, *rest)


def liger_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [B, S, H, D]; cos/sin: [S, D/2] (ours) -> liger's [1, S, D] rotate-half tables."""
    from liger_kernel.transformers.functional import liger_rope as rope

    cos, sin = (torch.cat((t, t), dim=-1).to(q.dtype) for t in (cos, sin))
    q2, k2 = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q2.transpose(1, 2), k2.transpose(1, 2)


class LigerFeedForward(FeedForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from liger_kernel.transformers.functional import liger_swiglu

        return self.w2(liger_swiglu(self.w1(x), self.w3(x)))


class LigerBlock(Block):
    """The block with the attention's residual add and the feed-forward's RMSNorm as one liger kernel
    (forward: the sum and its norm; backward: the norm's gradient plus the residual's)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        from liger_kernel.transformers.functional import liger_fused_add_rms_norm

        norm = self.ffn_norm
        a = self.attention(self.attention_norm(x), cos, sin)
        n, h = liger_fused_add_rms_norm(a, x, norm.weight, norm.variance_epsilon, in_place=False)
        return h + self.feed_forward(n)


def chunk_mem_const(tokens: int, hidden: int, vocab: int) -> int:
    """liger's ``chunk_mem_const`` (a chunk's logits hold at most about that many times tokens x
    hidden elements) for chunks of :data:`CHUNK_ROWS` rows where the vocabulary is large against the
    hidden size (liger's default, 1, gives 512-row chunks at hidden 2048 and vocabulary 128256): a
    constant whose chunks reach that many rows, or cover the tokens; 1 where liger's already do."""
    chunks = -(-tokens // CHUNK_ROWS)  # how many chunks of CHUNK_ROWS rows the tokens fill
    return max(1, -(-vocab // (hidden * chunks)))


def fused_cross_entropy(weight: torch.Tensor, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token loss of ``h @ weight^T`` against ``targets`` without the logits (-100 ignored)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    rows = h.flatten(0, 1)
    const = chunk_mem_const(rows.shape[0], rows.shape[1], weight.shape[0])
    return liger_fused_linear_cross_entropy(rows, weight, targets.flatten(), chunk_mem_const=const)


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
    for att in [m for m in model.modules() if isinstance(m, Attention)]:
        att.rope_fn = liger_rope
        for proj in (att.wq, att.wk):
            proj.weight.copy_(to_rotate_half(proj.weight, hd))
            if isinstance(proj, LoRALinear):
                proj.lora_b.copy_(to_rotate_half(proj.lora_b, hd))
    if model.output is not None:
        model.fused_loss = fused_cross_entropy
