"""LoRA's q/k/v projections with the rotary embedding in the same Triton kernels
(``train/lora_rope_kernel.py``, ``fused=liger``'s LoRA attentions on CUDA), run by Triton's
interpreter on CPU tensors: the rotated q and k, v, and the gradients of x, each A and each B match
the textbook formula (x W^T + s x A^T B^T, then each head's halves rotated) in fp64, for fp32 and
bf16, with grouped k/v heads, a token count that is not a multiple of the kernels' rows per
program, tables for one sequence applied to every row of the batch, and an output left out of the
loss (its gradient None)."""

import torch

from ..conftest import run_interpreted


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each head's halves (h1, h2) -> (h1 cos - h2 sin, h2 cos + h1 sin); t: [B, S, H, D]."""
    h1, h2 = t.chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((h1 * c - h2 * s, h2 * c + h1 * s), dim=-1)


def check() -> None:
    from sweepbench.train.lora_rope_kernel import ROWS, LoRARopeQKV, fits

    g = torch.Generator().manual_seed(0)
    bsz, seq, d, head_dim, heads, kv_heads, rank = 2, ROWS // 2 + 3, 64, 32, 2, 1, 16  # 70 tokens
    outs = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    angles = torch.rand(seq, head_dim // 2, generator=g) * 6
    cos, sin = angles.cos(), angles.sin()
    for dtype in (torch.float32, torch.bfloat16):
        for used in ((True, True, True), (True, False, True)):  # k left out of the loss
            x0 = torch.randn(bsz, seq, d, generator=g)
            ws = [torch.randn(o, d, generator=g) * d**-0.5 for o in outs]
            as_ = [torch.randn(rank, d, generator=g) * d**-0.5 for _ in outs]
            bs = [torch.randn(o, rank, generator=g) * 0.2 for o in outs]
            scales = (2.0, 0.5, 1.0)
            grads = [torch.randn(bsz, seq, o // head_dim, head_dim, generator=g) for o in outs]

            def run(fn, cast: torch.dtype) -> list[torch.Tensor]:  # noqa: ANN001
                x = x0.to(cast).requires_grad_()
                a = [t.to(cast).requires_grad_() for t in as_]
                b = [t.to(cast).requires_grad_() for t in bs]
                w = [t.to(cast) for t in ws]
                q, k, v = fn(x, w, a, b)
                picked = [(o, gr.to(cast)) for o, gr, u in zip((q, k, v), grads, used) if u]
                torch.autograd.backward([o for o, _ in picked], [gr for _, gr in picked])
                return [q, k, v, x.grad, *[t.grad for t in a], *[t.grad for t in b]]

            def reference(x, w, a, b):  # noqa: ANN001, ANN202
                ys = [(x @ wi.t() + s * (x @ ai.t()) @ bi.t()).view(bsz, seq, -1, head_dim)
                      for wi, ai, bi, s in zip(w, a, b, scales)]
                return rotate(ys[0], cos.double(), sin.double()), rotate(ys[1], cos.double(), sin.double()), ys[2]

            def kernels(x, w, a, b):  # noqa: ANN001, ANN202
                params = [t for i in range(3) for t in (w[i], a[i], b[i])]
                assert fits(x, params, head_dim)
                return LoRARopeQKV.apply(x, scales, cos, sin, head_dim, *params)

            ref = run(reference, torch.float64)
            got = run(kernels, dtype)
            names = ("q", "k", "v", "grad x", "grad A_q", "grad A_k", "grad A_v", "grad B_q", "grad B_k", "grad B_v")
            # fp32: the same math to fp32's rounding; bf16 within a few units in the last place (the
            # interpreter rounds its bf16 casts toward zero, a GPU to nearest) of the largest value
            tol = 1e-5 if dtype == torch.float32 else 2**-6
            for name, r, o in zip(names, ref, got):
                if r is None:  # B_k's gradient where k took no part in the loss
                    assert o is None, name
                    continue
                assert o.dtype == dtype and o.shape == r.shape, name
                err, scale = (o.double() - r.detach()).abs().max().item(), r.abs().max().item()
                assert err <= tol * scale, (name, dtype, used, err, scale)
    print("lora rope kernels ok")


def test_lora_rope_kernels_match_the_textbook_formula():
    assert run_interpreted("tests.train.test_lora_rope_kernel") == "lora rope kernels ok"
