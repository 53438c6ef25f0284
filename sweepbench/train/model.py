"""A Llama-3-style decoder on plain torch: RMSNorm, RoPE, GQA attention through SDPA, SwiGLU.

Layers live in a ``ModuleDict`` keyed by their index in the full model, so a pipeline stage that
keeps layers 8..15 still names them ``layers.8`` ..: parameter names are the same in every
layout, which is what makes the initialisation (seeded by name) identical in every layout.
Built on the meta device; :func:`init_weights` materialises it (see ``init.py``)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from sweepbench.parallel.specs import ModelShape

ROPE_THETA = 500000.0  # Llama 3's
# attention kernel: (q, k, v) with heads on dim 1 and the sequence on dim 2 -> output, causal
AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class LoRALinear(nn.Module):
    """A frozen base weight plus a trainable low-rank update: y = x W^T + (alpha/r) x A^T B^T.
    B starts at zero (the adapted model starts as the base model), A small and random."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, alpha: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)  # frozen base
        self.lora_a = nn.Parameter(torch.empty(rank, in_features))
        self.lora_b = nn.Parameter(torch.empty(out_features, rank))
        self.scale = alpha / rank
        self.wide: torch.Tensor | None = None  # [W | room], W the weight's memory, once an input had room (_widened)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fusable(x, [self]):
            return _LoRAGroup.apply(x, (self.scale,), None, self.weight, self.lora_a, self.lora_b)[0]
        # one kernel adds the scaled update (add's alpha), where a multiply and an add each read and
        # wrote the whole output
        return torch.add(F.linear(x, self.weight), F.linear(F.linear(x, self.lora_a), self.lora_b), alpha=self.scale)


def eager_plain(x: torch.Tensor) -> bool:
    """Whether a hand-written autograd function may take ``x``: a plain tensor (a tensor-parallel
    DTensor goes through torch's ops), no autocast (it casts what F.linear sees), not under
    torch.compile (Inductor fuses the unfused ops itself)."""
    return (
        not torch.compiler.is_compiling() and not torch.is_autocast_enabled(x.device.type) and type(x) is torch.Tensor
    )


def _fusable(x: torch.Tensor, layers: list[LoRALinear]) -> bool:
    """Whether :class:`_LoRAGroup` may run these layers: :func:`eager_plain`, plain weights of
    ``x``'s dtype (a DTensor or a quantized weight goes through torch's ops), the weights frozen."""
    if not eager_plain(x):
        return False
    return all(
        type(t) in (torch.Tensor, nn.Parameter) and t.dtype == x.dtype
        for m in layers
        for t in (m.weight, m.lora_a, m.lora_b)
    ) and not any(m.weight.requires_grad for m in layers)


class _LoRAGroup(torch.autograd.Function):
    """LoRA layers that read the same input (q, k and v; or one layer), with the update added inside
    the GEMMs: forward, x [A_1; A_2; ...]^T as one GEMM (the input read once for every layer's A),
    y_i = s_i (x A_i^T) B_i^T + x W_i^T as one addmm onto the low-rank product in the output's own
    buffer (cuBLAS' beta = s_i);
    backward, the layers' s_i (g_i B_i) side by side as one [tokens, sum of ranks] matrix (each GEMM
    writes its columns, s_i as its alpha; B_i's gradient likewise scaled by its GEMM), so that the A
    gradients are one GEMM over the input and their term of dx one GEMM, written first, onto which
    each g_i W_i is added by addmm, the widest last. Unfused, each layer's update was its own output
    plus an add kernel over the whole output, and dx a sum of 2 per layer whole-size gradients by
    add kernels. The frozen base weights get no gradient; the same arithmetic as the unfused ops,
    summed in another order."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        scales: tuple[float, ...],
        widened: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None,
        *params: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        if widened is not None:  # (x's rows with room, the widened weights): _widened
            return _LoRAGroup._forward_wide(ctx, x, *widened, scales, params)
        x2 = x.reshape(-1, x.shape[-1])
        a_all = torch.cat(params[1::3]) if len(scales) > 1 else params[1]  # [sum of ranks, in]
        xa_all = x2 @ a_all.t()
        outs = []
        for i, (scale, cols) in enumerate(zip(scales, _rank_cols(params))):
            weight, _, b = params[3 * i : 3 * i + 3]
            xa = xa_all[:, cols]
            # the low-rank product written into the output, then the base GEMM adding onto it in its
            # epilogue (beta), both by out=: an out-of-place addmm first copied its input into a new
            # output (a whole-output copy on the device), and a selective checkpoint refuses an
            # in-place change of a GEMM's output it kept (it keeps no out= product)
            y = x2.new_empty(x2.shape[0], weight.shape[0])
            torch.mm(xa, b.t(), out=y)
            outs.append(torch.addmm(y, x2, weight.t(), beta=scale, out=y).view(*x.shape[:-1], -1))
        _LoRAGroup._keep(ctx, scales, x, xa_all, a_all, params)
        return tuple(outs)

    @staticmethod
    def _keep(
        ctx: Any,
        scales: tuple[float, ...],
        x: torch.Tensor,
        xa_all: torch.Tensor,
        a_all: torch.Tensor,
        params: tuple[torch.Tensor, ...],
    ) -> None:
        ctx.scales = scales
        ctx.set_materialize_grads(False)  # an unused output's gradient comes as None, not zeros
        ctx.save_for_backward(x, xa_all, a_all, *params)

    @staticmethod
    def _forward_wide(
        ctx: Any,
        x: torch.Tensor,
        wide: torch.Tensor,
        wides: tuple[torch.Tensor, ...],
        scales: tuple[float, ...],
        params: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, ...]:
        """The forward where ``x``'s rows have room past their ends (``wide``: [tokens, in + room],
        ``x`` its first ``in`` columns) and the weights are widened alike (:func:`_widened`):
        x A^T goes into the room (zeros past the ranks), each widened weight's room gets s_i B_i in
        layer i's columns, and each output is one GEMM over the widened input, y_i = [x | x A^T]
        [W_i | s_i B_i]^T: no low-rank product written apart and read again. The backward is the
        same as without the room: x and x A^T are kept as the columns of ``wide`` they are."""
        d = x.shape[-1]
        cols = _rank_cols(params)
        width = cols[-1].stop
        pad = wide.shape[1] - d - width
        a_all = torch.cat([*params[1::3], *([params[1].new_zeros(pad, d)] if pad else [])])
        torch.mm(wide[:, :d], a_all.t(), out=wide[:, d:])
        tails = [w[:, d + c.start : d + c.stop] for w, c in zip(wides, cols)]
        torch._foreach_copy_(tails, list(params[2::3]))  # B changes every step
        if any(s != 1.0 for s in scales):
            torch._foreach_mul_(tails, list(scales))
        outs = [torch.mm(wide, w.t()).view(*x.shape[:-1], -1) for w in wides]
        _LoRAGroup._keep(ctx, scales, x, wide[:, d : d + width], a_all[:width], params)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, xa_all, a_all, *params = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        n = len(ctx.scales)
        dx: torch.Tensor | None = None
        gxa_all = torch.empty_like(xa_all)  # s_i (g_i B_i) in layer i's columns, zeros where g_i is None
        grad_bs: list[torch.Tensor | None] = []
        terms: list[tuple[torch.Tensor, torch.Tensor]] = []  # (g_i, W_i) of the outputs in the loss
        all_cols = _rank_cols(params)
        for i, (scale, g, cols) in enumerate(zip(ctx.scales, grads, all_cols)):
            weight, _, b = params[3 * i : 3 * i + 3]
            if g is None:  # this output took no part in the loss
                gxa_all[:, cols].zero_()
                grad_bs.append(None)
                continue
            g2 = g.reshape(-1, g.shape[-1])
            _mm_scaled(g2, b, scale, out=gxa_all[:, cols])
            grad_bs.append(_mm_scaled(g2.t(), xa_all[:, cols], scale) if ctx.needs_input_grad[3 + 3 * i + 2] else None)
            terms.append((g2, weight))
        wants_a = [ctx.needs_input_grad[3 + 3 * i + 1] and grads[i] is not None for i in range(n)]
        grad_a_all = gxa_all.t() @ x2 if any(wants_a) else None
        if ctx.needs_input_grad[0] and terms:
            # the low-rank term written first (a GEMM over the ranks), then each base term added onto
            # it by its GEMM's epilogue, the widest last, where the low-rank term added last read and
            # wrote all of dx in a GEMM too short to hide it
            dx = torch.mm(gxa_all, a_all)
            for g2, weight in sorted(terms, key=lambda t: t[1].shape[0]):
                dx.addmm_(g2, weight)
            dx = dx.view(x.shape)
        param_grads: list[torch.Tensor | None] = []
        for i, cols in enumerate(all_cols):
            grad_a = grad_a_all[cols] if grad_a_all is not None and wants_a[i] else None
            param_grads += [None, grad_a, grad_bs[i]]
        return (dx, None, None, *param_grads)


ROOM_ALIGN = 64  # the widened GEMMs' inner size a multiple of this: 2048 + 48 measured slower than 2048 + 64


def lora_room(layers: list[nn.Module]) -> int:
    """The spare columns past each row of their input that LoRA layers reading it (q, k and v) can
    use: the sum of their ranks rounded up to :data:`ROOM_ALIGN`; 0 unless all are LoRA layers. An
    input handed over with that many (``fused.add_norm``'s ``room``) runs each layer as one GEMM
    (:meth:`_LoRAGroup._forward_wide`, the weights widened by :func:`_widened`)."""
    loras = [m for m in layers if isinstance(m, LoRALinear)]
    if not loras or len(loras) != len(layers):
        return 0
    return -(-sum(m.lora_a.shape[0] for m in loras) // ROOM_ALIGN) * ROOM_ALIGN


def _widened(layers: list[LoRALinear], x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
    """(``x``'s rows with their room as one [rows, in + room] matrix (:func:`_wide_rows`), the
    layers' widened weights [W_i | room]) where ``x`` has room for them (:func:`lora_room` spare
    columns), else None; ``layers`` as :func:`_fusable` passed them (plain frozen weights of
    ``x``'s dtype). The first such input widens them: W_i becomes the first columns of a
    [out, in + room] buffer (the weight a view of it: no second copy), the room zeros until the
    forward puts s_i B_i in layer i's rank columns. Widened where used, not before: a weight that
    FSDP shards or a quantizer swaps is never given a buffer it would keep alive."""
    room = lora_room(layers)  # type: ignore[arg-type]
    d = x.shape[-1]
    wide_rows = _wide_rows(x, d + room) if room else None
    if wide_rows is None:
        return None
    for m in layers:
        if m.wide is None or m.wide.data_ptr() != m.weight.data_ptr() or m.wide.shape[1] != d + room:
            wide = m.weight.new_zeros(m.weight.shape[0], d + room)
            wide[:, :d] = m.weight.data
            m.weight.data = wide[:, :d]
            m.wide = wide
    return wide_rows, tuple(m.wide for m in layers if m.wide is not None)


def _wide_rows(x: torch.Tensor, width: int) -> torch.Tensor | None:
    """``x`` ([..., in]) as the first columns of a [rows, width] matrix, where it is laid out as one
    (its rows ``width`` apart, densely, the storage reaching the last row's end), else None. Only
    for an input whose maker left the spare columns to its reader (``fused.add_norm``'s ``room``):
    the caller checks that the layers were widened for it."""
    d = x.shape[-1]
    if width <= d or x.stride(-1) != 1 or x.stride(-2) != width:
        return None
    for i in range(x.dim() - 2):
        if x.stride(i) != x.shape[i + 1] * x.stride(i + 1):
            return None
    rows = x.numel() // d
    if x.storage_offset() + rows * width > x.untyped_storage().nbytes() // x.element_size():
        return None
    # a tensor of its own over the same memory (set_, not a view of x): writing the spare columns
    # leaves x's version as it is, since x's values do not change (a view's write would count as
    # one to x, and autograd refuses that for an output of the function that made x)
    return x.new_empty(0).set_(x.untyped_storage(), x.storage_offset(), (rows, width), (width, 1))


def _rank_cols(params: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> list[slice]:
    """Each layer's columns of the side-by-side [tokens, sum of ranks] products (x A^T, g B), which are
    also its rows of the stacked A; ``params`` as :class:`_LoRAGroup` takes them (W, A, B per layer)."""
    cols, r0 = [], 0
    for a in params[1::3]:
        cols.append(slice(r0, r0 + a.shape[0]))
        r0 += a.shape[0]
    return cols


def _mm_scaled(a: torch.Tensor, b: torch.Tensor, scale: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """scale * (a @ b) as one GEMM (the scale as its alpha; beta 0: the input is never read), where a
    product and then a multiply over it were two kernels; written into ``out`` where given (a column
    block of a wider matrix: the GEMM writes it in place)."""
    nothing = a.new_empty(())
    if out is None:
        return torch.addmm(nothing, a, b, beta=0, alpha=scale)
    return torch.addmm(nothing, a, b, beta=0, alpha=scale, out=out)


class _LoRASplit(torch.autograd.Function):
    """A LoRA layer's two products over its input, x W^T and x A^T, for a reader that adds the
    scaled update s (x A^T) B^T itself (``add_norm_kernel.AddLoRARMSNorm``); backward, dx = g_xa A +
    g_y W (the low-rank term written first, the base added onto it by its GEMM's epilogue) and A's
    gradient g_xa^T x, where g_xa already carries s."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x, weight, a)
        ctx.set_materialize_grads(False)
        return (x2 @ weight.t()).view(*x.shape[:-1], -1), (x2 @ a.t()).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx: Any, g_y: torch.Tensor | None, g_xa: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, weight, a = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        gxa2 = g_xa.reshape(-1, g_xa.shape[-1]) if g_xa is not None else None
        dx: torch.Tensor | None = None
        if ctx.needs_input_grad[0]:
            if gxa2 is not None:
                dx = torch.mm(gxa2, a)
            if g_y is not None:
                gy2 = g_y.reshape(-1, g_y.shape[-1])
                dx = torch.mm(gy2, weight) if dx is None else dx.addmm_(gy2, weight)
        grad_a = gxa2.t() @ x2 if gxa2 is not None and ctx.needs_input_grad[2] else None
        return (dx.view(x.shape) if dx is not None else None), None, grad_a


def lora_split(x: torch.Tensor, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(x W^T, x A^T) of a LoRA layer that :class:`_LoRASplit` can run on ``x``, for a reader that
    adds s (x A^T) B^T itself; None for any other layer or input (run the layer whole)."""
    if not isinstance(layer, LoRALinear) or not _fusable(x, [layer]):
        return None
    y, xa = _LoRASplit.apply(x, layer.weight, layer.lora_a)
    return y, xa


class _FrozenGroup(torch.autograd.Function):
    """Frozen linear layers that read the same input (w1 and w3 of a LoRA run's feed-forward): the
    outputs as the plain GEMMs; backward, dx = g_1 W_1 + g_2 W_2 ... by addmm into one buffer, where
    autograd summed the layers' whole-size input gradients with an add kernel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*weights)
        ctx.shape = x.shape
        return tuple(F.linear(x, w) for w in weights)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        weights = ctx.saved_tensors  # once: activation checkpointing unpacks each saved tensor once only
        dx: torch.Tensor | None = None
        for w, g in zip(weights, grads):
            if g is not None:
                g2 = g.reshape(-1, g.shape[-1])
                dx = torch.mm(g2, w) if dx is None else dx.addmm_(g2, w)
        return (dx.view(ctx.shape) if dx is not None else None, *(None for _ in weights))


def frozen_group(x: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """Plain linear layers (each reading ``x``) applied to ``x``: in one :class:`_FrozenGroup` where
    their weights are frozen parameters of ``x``'s dtype (no DTensor or quantized weight) and
    :func:`eager_plain` holds, else one by one."""
    weights = [getattr(m, "weight", None) for m in layers]
    if (
        x.requires_grad
        and all(type(m) is nn.Linear and m.bias is None for m in layers)
        and eager_plain(x)
        and all(type(w) is nn.Parameter and w.dtype == x.dtype and not w.requires_grad for w in weights)
    ):
        return list(_FrozenGroup.apply(x, *weights))
    return [m(x) for m in layers]


def lora_group(x: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """The layers (each reading ``x``) applied to ``x``: in one :class:`_LoRAGroup` where they are
    all LoRA layers it can run, else one by one."""
    loras = [m for m in layers if isinstance(m, LoRALinear)]
    if len(loras) == len(layers) and _fusable(x, loras):
        params = [t for m in loras for t in (m.weight, m.lora_a, m.lora_b)]
        return list(_LoRAGroup.apply(x, tuple(m.scale for m in loras), _widened(loras, x), *params))
    return [m(x) for m in layers]


def _linear(d_in: int, d_out: int, lora_rank: int, lora_alpha: float) -> LoRALinear | nn.Linear:
    if lora_rank:
        return LoRALinear(d_in, d_out, rank=lora_rank, alpha=lora_alpha)
    return nn.Linear(d_in, d_out, bias=False)


def rope_pair(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of each head by the position's angles, in fp32; x: [B, S, H, D],
    cos/sin: [S, D/2] for the positions x holds. Each pair is a complex number times e^(i angle): one
    multiply over the pairs (as Meta's and torchtitan's Llama), where the pairs' four products, their
    sum and difference and the stacking were a kernel each, forward and backward. cos/sin may come in
    bf16 (FSDP casts a layer's floating inputs to its parameter dtype); the turn is built in fp32."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    turn = torch.complex(cos.float(), sin.float())[None, :, None, :]
    return torch.view_as_real(pairs * turn).flatten(-2).type_as(x)


def rope_tables(head_dim: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, *, lora_rank: int, lora_alpha: float) -> None:
        super().__init__()
        d, hd = shape.hidden_size, shape.head_dim
        self.head_dim = hd
        self.wq = _linear(d, shape.num_heads * hd, lora_rank, lora_alpha)
        self.wk = _linear(d, shape.kv_dim, lora_rank, lora_alpha)
        self.wv = _linear(d, shape.kv_dim, lora_rank, lora_alpha)
        self.wo = _linear(shape.num_heads * hd, d, lora_rank, lora_alpha)
        self.attn_fn: AttnFn = sdpa_attention  # context parallel swaps in the ring kernel
        # spare columns past each row of the input that q, k and v's LoRA layers can use (lora_room)
        self.input_room = 0
        self.rope_fn = rope_pair  # (q, k, cos, sin) -> rotated (q, k); fused.py swaps in liger's

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.wo(self.attend(x, cos, sin))

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The heads' attention output before the output projection, [batch, seq, heads x head_dim]."""
        bsz, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds whole heads, fewer of them
        q, k, v = (t.view(bsz, seq, -1, self.head_dim) for t in lora_group(x, [self.wq, self.wk, self.wv]))
        q, k = self.rope_fn(q, k, cos, sin)
        out = self.attn_fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2).reshape(bsz, seq, -1)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size, bias=False)
        self.w3 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = frozen_group(x, [self.w1, self.w3])
        return self.w2(F.silu(a) * b)


class Block(nn.Module):
    def __init__(self, shape: ModelShape, *, lora_rank: int, lora_alpha: float) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.hidden_size, eps=1e-5)
        self.attention = Attention(shape, lora_rank=lora_rank, lora_alpha=lora_alpha)
        self.ffn_norm = nn.RMSNorm(shape.hidden_size, eps=1e-5)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it (``tok_embeddings`` only on the first stage,
    ``norm``/``output`` only on the last). Input: token ids on the first stage, hidden states on
    the others; output: logits on the last stage, hidden states on the others."""

    def __init__(self, shape: ModelShape, *, lora_rank: int = 0, lora_alpha: float = 16.0) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings: nn.Module | None = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleDict(
            {str(i): Block(shape, lora_rank=lora_rank, lora_alpha=lora_alpha) for i in range(shape.num_layers)}
        )
        self.norm: nn.Module | None = nn.RMSNorm(shape.hidden_size, eps=1e-5)
        self.output: nn.Module | None = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        # the positions this rank's tokens hold (context parallel: its shards of the sequence)
        self.positions: torch.Tensor | None = None
        # (output weight, hidden states, targets) -> mean loss, for forward(x, targets): fused.py's
        self.fused_loss: Callable | None = None
        # the rotary tables and what they were made for: (None, seq, device), or (positions, its version, None)
        self._rope_kept: tuple[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] | None = None

    def keep_stage(self, layer_ids: range, *, first: bool, last: bool) -> "Transformer":
        """Drop what a pipeline stage does not hold (in place)."""
        for key in list(self.layers):
            if int(key) not in layer_ids:
                del self.layers[key]
        if not first:
            self.tok_embeddings = None
        if not last:
            self.norm = self.output = None
        return self

    def _rope(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables of this rank's positions (``positions``, else 0..seq-1); in eager steps
        computed once and kept while those positions are the same tensor, unchanged (a step would
        otherwise start with their small kernels, the GPU waiting on each launch)."""
        positions = self.positions

        def make() -> tuple[torch.Tensor, torch.Tensor]:
            return rope_tables(
                self.shape.head_dim, torch.arange(seq, device=device) if positions is None else positions
            )

        if torch.compiler.is_compiling():
            return make()
        key = (None, seq, device) if positions is None else (positions, positions._version, None)
        kept = self._rope_kept
        if kept is None or kept[0][0] is not key[0] or kept[0][1:] != key[1:]:
            with torch.inference_mode(False):  # kept for training steps, whatever mode this one runs in
                self._rope_kept = kept = (key, make())
        return kept[1]

    def run_blocks(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The blocks, then the final norm where this stage holds it (``fused.FusedTransformer``
        carries the residual stream between its blocks as a sum not yet added)."""
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.norm(h) if self.norm is not None else h

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        h = self.run_blocks(h, *self._rope(x.shape[1], h.device))
        if targets is not None:  # the loss, through a fused head that never materialises the logits
            assert self.fused_loss is not None and self.output is not None
            return self.fused_loss(self.output.weight, h, targets)
        return self.output(h) if self.output is not None else h


def init_std(name: str, shape: ModelShape) -> float | None:
    """torchtitan's initialisation: std 1 for the embedding, d^-0.5 for the output, 0.02 for the
    other weights with the output projections of each block scaled by depth; None: ones (norms),
    0.0: zeros (LoRA's B)."""
    if "norm" in name:
        return None
    if name.endswith("lora_b"):
        return 0.0
    if name.startswith("tok_embeddings"):
        return 1.0
    if name.startswith("output"):
        return shape.hidden_size**-0.5
    if ".wo." in name or ".w2." in name or ".w3." in name:
        layer = int(name.split(".")[1])
        return 0.02 / math.sqrt(2 * (layer + 1))
    return 0.02
