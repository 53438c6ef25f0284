"""The training model's RoPE and LoRA: the same numbers as their textbook formulas, forward and
backward, in fewer operations over whole activations (each one a kernel on a GPU in eager mode)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from sweepbench.parallel.specs import ModelShape
from sweepbench.train.model import (
    FeedForward,
    LoRALinear,
    Transformer,
    apply_rope,
    frozen_group,
    lora_group,
    rope_tables,
    lora_room,
)


class _Ops(TorchDispatchMode):
    """Counts the aten operations run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).type_as(x)


def _fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> tuple[Any, ...]:
    x = x.detach().requires_grad_()
    with _Ops() as counted:
        out = fn(x)
        out.backward(grad)
    return out.detach(), x.grad, sum(counted.ops.values())


@pytest.mark.parametrize("tables", [torch.float32, torch.bfloat16])  # bf16: as FSDP casts a layer's inputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_as_complex_turns_is_the_pairs_formula_in_fewer_ops(dtype: torch.dtype, tables: torch.dtype) -> None:
    cos, sin = (t.to(tables) for t in rope_tables(64, torch.arange(3, 131)))  # a shard's positions, as CP has
    x = torch.randn(2, 128, 4, 64, dtype=dtype)
    grad = torch.randn(2, 128, 4, 64, dtype=dtype)
    out, gx, ops = _fwd_bwd(lambda t: apply_rope(t, cos, sin), x, grad)
    ref, gref, ref_ops = _fwd_bwd(lambda t: _pairs(t, cos, sin), x, grad)
    assert torch.equal(out, ref) and torch.equal(gx, gref)
    assert ops < ref_ops, (ops, ref_ops)


def test_lora_adds_its_scaled_update_in_one_op() -> None:
    torch.manual_seed(0)
    lora = LoRALinear(32, 48, rank=4, alpha=16.0)
    with torch.no_grad():
        for p in lora.parameters():
            p.normal_()
    x, grad = torch.randn(2, 8, 32), torch.randn(2, 8, 48)

    def textbook(t: torch.Tensor) -> torch.Tensor:
        return F.linear(t, lora.weight) + F.linear(F.linear(t, lora.lora_a), lora.lora_b) * lora.scale

    out, gx, ops = _fwd_bwd(lora, x, grad)
    ga, gb = lora.lora_a.grad, lora.lora_b.grad
    lora.zero_grad(set_to_none=True)
    ref, gref, ref_ops = _fwd_bwd(textbook, x, grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, gref)
    torch.testing.assert_close(ga, lora.lora_a.grad)
    torch.testing.assert_close(gb, lora.lora_b.grad)
    assert ops < ref_ops, (ops, ref_ops)


def _textbook(lora: LoRALinear, t: torch.Tensor) -> torch.Tensor:
    return F.linear(t, lora.weight) + F.linear(F.linear(t, lora.lora_a), lora.lora_b) * lora.scale


@pytest.mark.parametrize("used", [(0, 1, 2), (0, 2)])  # (0, 2): k's output takes no part in the loss
def test_lora_layers_reading_one_input_add_their_updates_and_gradients_inside_the_matmuls(used: tuple) -> None:
    """q, k and v's LoRA layers as attention runs them (one input): the same outputs and
    gradients as the textbook formula, with no whole-size add left: each update is added by the
    matmul that writes the output, each term of dx by the matmul that computes it."""
    torch.manual_seed(0)
    layers = [LoRALinear(32, out, rank=4, alpha=16.0) for out in (48, 16, 16)]
    for m in layers:
        with torch.no_grad():
            for p in m.parameters():
                p.normal_()
    x = torch.randn(2, 8, 32)
    grads = [torch.randn(2, 8, m.weight.shape[0]) for m in layers]

    def run(fn: Callable[[torch.Tensor], list[torch.Tensor]]) -> tuple[Any, ...]:
        for m in layers:
            m.zero_grad(set_to_none=True)
        leaf = x.detach().requires_grad_()
        with _Ops() as counted:
            outs = fn(leaf)
            torch.autograd.backward([outs[i] for i in used], [grads[i] for i in used])
        params = [(m.lora_a.grad, m.lora_b.grad) for m in layers]
        return [o.detach() for o in outs], leaf.grad, params, counted.ops

    outs, gx, params, ops = run(lambda t: lora_group(t, layers))  # type: ignore[arg-type]
    ref_outs, ref_gx, ref_params, ref_ops = run(lambda t: [_textbook(m, t) for m in layers])
    close = {"rtol": 1e-4, "atol": 1e-4}  # the same arithmetic, its sums in another order (fp32)
    for got, want in zip(outs, ref_outs):
        torch.testing.assert_close(got, want, **close)
    torch.testing.assert_close(gx, ref_gx, **close)
    for i, ((ga, gb), (ra, rb)) in enumerate(zip(params, ref_params)):
        if i in used:
            torch.testing.assert_close(ga, ra, **close)
            torch.testing.assert_close(gb, rb, **close)
        else:
            assert ga is None and gb is None and ra is None and rb is None
    assert ops["aten.add"] == 0 and ops["aten.mul"] == 0, ops  # the unfused path's adds and scalings
    # no scaling after a GEMM (each scales in its epilogue) and one concatenation (the forward's As)
    assert ops["aten.mul_"] == 0 and ops["aten.cat"] == (1 if len(layers) > 1 else 0), ops
    assert ref_ops["aten.add"] > 0
    assert sum(ops.values()) < sum(ref_ops.values()), (ops, ref_ops)


def test_lora_layers_leave_the_input_without_a_gradient_where_it_needs_none() -> None:
    torch.manual_seed(0)
    layers = [LoRALinear(32, 16, rank=4, alpha=8.0) for _ in range(2)]
    for m in layers:
        with torch.no_grad():
            for p in m.parameters():
                p.normal_()
    x = torch.randn(3, 32)  # no requires_grad: the first block's input under LoRA (embedding frozen)
    with _Ops() as counted:
        outs = lora_group(x, layers)  # type: ignore[arg-type]
        sum(o.sum() for o in outs).backward()
    refs = [_textbook(m, x) for m in layers]
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.detach(), r.detach())
    for m in layers:
        assert m.lora_a.grad is not None and m.lora_b.grad is not None and m.weight.grad is None
    # the updates added by the forward's GEMMs (2 addmm), each layer's two scaled products in the
    # backward (2 addmm each), and no [tokens, in] product for dx: the 4 mm are the forward's x A^T
    # and x A^T B^T (one per layer), and the backward's A gradients
    assert counted.ops["aten.addmm"] == 2 + 2 * len(layers) and counted.ops["aten.addmm_"] == 0, counted.ops
    assert counted.ops["aten.mm"] == 4, counted.ops


def test_lora_layers_widened_for_an_input_with_room_run_each_output_as_one_matmul() -> None:
    """q, k and v's LoRA layers on an input whose rows have spare columns past their ends (as the
    fused norm writes it; here full of NaN, as memory nobody wrote may be): the first such input
    widens their weights ([W | room], W still the weight's memory; an input without room before it
    leaves them as they are), and they give the textbook outputs and gradients over two steps with
    B changed between them (the room's s B refreshed), each output one matmul (no addmm onto a
    low-rank product); the widened layers on an input without room, as before."""

    def layers() -> list[LoRALinear]:
        torch.manual_seed(0)
        made = [LoRALinear(32, out, rank=4, alpha=8.0) for out in (48, 16, 16)]  # scale 2
        for m in made:
            with torch.no_grad():
                for p in m.parameters():
                    p.normal_()
        return made

    plain, wide = layers(), layers()
    room = lora_room(wide)  # type: ignore[arg-type]
    assert room == 64  # 3 x rank 4, rounded up to 64
    x = torch.randn(2, 8, 32)
    grads = [torch.randn(2, 8, m.weight.shape[0]) for m in plain]

    def run(group: list[LoRALinear], inp: torch.Tensor) -> tuple[Any, ...]:
        for m in group:
            m.zero_grad(set_to_none=True)
        inp = inp.detach().requires_grad_()
        with _Ops() as counted:
            outs = lora_group(inp, group)  # type: ignore[arg-type]
        torch.autograd.backward(outs, grads)
        return [o.detach() for o in outs], inp.grad, [(m.lora_a.grad, m.lora_b.grad) for m in group], counted.ops

    run(wide, x)
    assert all(m.wide is None and m.weight.is_contiguous() for m in wide)  # no room, nothing widened
    close = {"rtol": 1e-4, "atol": 1e-4}
    for _ in range(2):
        rows = torch.full((16, 32 + room), float("nan"))
        rows[:, :32] = x.reshape(16, 32)
        with_room = rows[:, :32].view(2, 8, 32)
        ref = run(plain, x)
        for inp, forward_addmm in ((with_room, 0), (x, 3)):
            got = run(wide, inp)
            for a, b in zip(got[0], ref[0]):
                torch.testing.assert_close(a, b, **close)
            torch.testing.assert_close(got[1], ref[1], **close)
            for (ga, gb), (ra, rb) in zip(got[2], ref[2]):
                torch.testing.assert_close(ga, ra, **close)
                torch.testing.assert_close(gb, rb, **close)
            assert got[3]["aten.addmm"] == forward_addmm, got[3]
        for m in wide:
            assert m.wide is not None and m.wide.shape == (m.weight.shape[0], 32 + room)
            assert m.weight.data_ptr() == m.wide.data_ptr()
        torch.testing.assert_close(ref[0][0], _textbook(plain[0], x).detach(), **close)
        with torch.no_grad():  # an optimizer step on B
            for group in (plain, wide):
                for m in group:
                    m.lora_b.add_(0.25)


def test_only_lora_layers_of_plain_frozen_weights_are_widened() -> None:
    lora = LoRALinear(32, 16, rank=4, alpha=8.0)
    plain = torch.nn.Linear(32, 16, bias=False)
    assert lora_room([lora, plain]) == 0 and lora_room([lora]) == 64
    with torch.no_grad():
        for p in lora.parameters():
            p.normal_()
    rows = torch.zeros(4, 32 + 64)
    lora.weight.requires_grad_(True)  # a trained base weight: the plain ops, nothing widened
    lora_group(rows[:, :32], [lora])
    assert lora.wide is None


@pytest.mark.parametrize(
    ("tokens", "hidden", "vocab", "rows"),
    [
        (16384, 2048, 128256, 2048),  # Llama-3.2-1B at 4 x 4096: liger's default chunks are 512 rows
        (16384, 4096, 32000, 2048),  # Mistral-7B: liger's default already gives 2048 rows (constant 1)
        (4096, 2048, 128256, 2048),
        (300, 64, 512, 300),  # fewer tokens than a chunk: one chunk covers them
    ],
)
def test_loss_chunks_reach_their_rows_or_cover_the_tokens(tokens: int, hidden: int, vocab: int, rows: int) -> None:
    """The fused cross-entropy's chunk constant, put through liger's own chunk arithmetic (the
    smallest power of two at least tokens / ceil(vocab / (const x hidden)), at most the tokens)."""
    from sweepbench.train.fused import chunk_mem_const

    const = chunk_mem_const(tokens, hidden, vocab)
    per = -(-tokens // -(-vocab // (const * hidden)))
    chunk = min(1 << (per - 1).bit_length(), tokens)
    assert chunk == rows, (const, chunk)


def _tiny_shape() -> ModelShape:
    return ModelShape.from_config(
        {
            "name": "t",
            "num_layers": 1,
            "hidden_size": 32,
            "num_heads": 4,
            "num_kv_heads": 4,
            "ffn_hidden_size": 64,
            "vocab_size": 16,
            "seq_len": 8,
        }
    )


def _tiny_ffn() -> FeedForward:
    return FeedForward(_tiny_shape())


def test_rotary_tables_are_made_once_for_the_same_positions() -> None:
    """The decoder keeps its rotary tables while its positions are the same tensor, unchanged (a
    trainer's steps): made again for new positions (a packed batch's) or positions changed in place."""
    torch.manual_seed(0)
    model = Transformer(_tiny_shape())
    x = torch.randint(0, 16, (2, 8))

    def tables_made(positions: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        if positions is not None:
            model.positions = positions
        with torch.no_grad(), _Ops() as counted:
            out = model(x)
        return counted.ops["aten.cos"], out

    for first in (None, torch.arange(8)):  # no positions (0..seq-1), then a trainer's
        made, out = tables_made(first)
        assert made == 1
        again, out2 = tables_made()
        assert again == 0 and torch.equal(out, out2)
    assert tables_made(torch.arange(8))[0] == 1  # a new tensor (equal values): made again
    model.positions.add_(3)  # in place: made again, and the output follows
    made, shifted = tables_made()
    assert made == 1 and not torch.equal(shifted, out)
    assert torch.equal(shifted, tables_made(torch.arange(3, 11))[1])


def test_frozen_layers_reading_one_input_sum_the_input_gradient_inside_the_matmuls() -> None:
    """The feed-forward's w1 and w3 with frozen weights (a LoRA run): the same outputs and input
    gradient as the plain layers, the two gradient terms summed by the second matmul (addmm), not
    by an add kernel; trained weights take the plain layers and get their gradients."""
    torch.manual_seed(0)
    ffn = _tiny_ffn()
    x, grad = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    ffn.requires_grad_(False)

    def plain(t: torch.Tensor) -> torch.Tensor:
        return ffn.w2(F.silu(ffn.w1(t)) * ffn.w3(t))

    out, gx, _ = _fwd_bwd(ffn, x, grad)
    ref, ref_gx, _ = _fwd_bwd(plain, x, grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-4, atol=1e-4)
    leaf = x.detach().requires_grad_()
    a, b = frozen_group(leaf, [ffn.w1, ffn.w3])
    with _Ops() as counted:
        torch.autograd.backward([a, b], [torch.ones_like(a), torch.ones_like(b)])
    assert counted.ops["aten.add"] == 0 and counted.ops["aten.addmm_"] == 1, counted.ops
    ffn.requires_grad_(True)  # a full fine-tune: the plain layers, weight gradients
    out, gx, _ = _fwd_bwd(ffn, x, grad)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-4, atol=1e-4)
    assert ffn.w1.weight.grad is not None and ffn.w3.weight.grad is not None


def test_frozen_group_recomputes_under_activation_checkpointing() -> None:
    """The group's backward reads its saved weights once: under non-reentrant checkpointing (as
    ``ac=full`` wraps each block) saved tensors unpack once only."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    ffn = _tiny_ffn().requires_grad_(False)
    x, grad = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    out, gx, _ = _fwd_bwd(lambda t: checkpoint(ffn, t, use_reentrant=False), x, grad)
    ref, ref_gx, _ = _fwd_bwd(ffn, x, grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, ref_gx)
