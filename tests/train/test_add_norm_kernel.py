"""The residual add + RMSNorm's Triton kernels (``train/add_norm_kernel.py``, ``fused=liger``'s blocks on
CUDA), run by Triton's interpreter on CPU tensors: forward and backward give what torch's add and
F.rms_norm give, for fp32 and bf16, the weight trained or frozen, with and without a gradient reaching
the sum from its other reader, at a width that is not a power of two and a row count that is not a
multiple of the backward's rows per program; and with the norm written into wider rows (``room``)."""

import torch
import torch.nn.functional as F

from ..conftest import run_interpreted


def check() -> None:
    from sweepbench.train.add_norm_kernel import ROWS, AddRMSNorm

    g = torch.Generator().manual_seed(0)
    shape = (ROWS + 1, 3, 96)  # 27 rows: the backward's last program has 3 of its 8; 96: not a power of two
    for dtype in (torch.float32, torch.bfloat16):
        for trained in (True, False):
            for both in (True, False):  # a gradient reaching the sum as well as its norm
                values = [torch.randn(shape, generator=g).to(dtype) for _ in range(4)]  # residual, update, d_out, d_total
                weight = torch.rand(shape[-1], generator=g).add(0.5).to(dtype)

                def run(fn, cast: torch.dtype) -> list[torch.Tensor]:  # noqa: ANN001
                    res, upd = (t.to(cast).requires_grad_() for t in values[:2])
                    w = weight.to(cast).requires_grad_(trained)
                    out, total = fn(res, upd, w)
                    grads = torch.autograd.grad([out, total][: 1 + both], [res, upd, *[w][:trained]],
                                                [t.to(cast) for t in values[2:][: 1 + both]])
                    return [out, total, *grads]

                ref = run(lambda r, u, w: (F.rms_norm(r + u, (shape[-1],), w, 1e-5), r + u), torch.float64)
                got = run(lambda r, u, w: AddRMSNorm.apply(r, u, w, 1e-5), dtype)
                # fp32: the same math to fp32's rounding; bf16 within a few units in the last place (the
                # interpreter rounds its bf16 casts toward zero, a GPU to nearest), of the largest value
                tol = 1e-5 if dtype == torch.float32 else 2**-6
                for name, r, o in zip(("out", "total", "grad residual", "grad update", "grad weight"), ref, got):
                    assert o.dtype == dtype and o.shape == r.shape, name
                    err, scale = (o.double() - r).abs().max().item(), r.abs().max().item()
                    assert err <= tol * scale, (name, dtype, trained, both, err, scale)
    # room: the norm's output written as the first columns of rows that many columns wider (the
    # spare ones left to its reader): the same values and gradients, its rows n + room apart
    res, upd = (torch.randn(shape, generator=g, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    weight = torch.rand(shape[-1], generator=g).add(0.5).to(torch.bfloat16)
    d_out = torch.randn(shape, generator=g, dtype=torch.bfloat16)
    outs = []
    for room in (0, 64):
        out, total = AddRMSNorm.apply(res, upd, weight, 1e-5, room)
        assert out.shape == shape and out.stride()[-2:] == (shape[-1] + room, 1), (room, out.stride())
        outs.append((out.detach().clone(), *torch.autograd.grad(out, [res, upd], d_out)))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    print("add norm kernels ok")


def test_add_norm_kernels_match_torchs_add_and_rms_norm():
    assert run_interpreted("tests.train.test_add_norm_kernel") == "add norm kernels ok"
