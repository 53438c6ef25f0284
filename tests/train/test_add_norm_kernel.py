"""The residual add + RMSNorm's Triton kernels (``train/add_norm_kernel.py``, ``fused=liger``'s blocks on
CUDA), run by Triton's interpreter on CPU tensors: forward and backward give what torch's add and
F.rms_norm give, for fp32 and bf16, the weight trained or frozen, with and without a gradient reaching
the sum from its other reader, at a width that is not a power of two and a row count that is not a
multiple of the backward's rows per program; with the norm written into wider rows (``room``); and
with an output projection's low-rank LoRA update added inside the forward (``AddLoRARMSNorm``)."""

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
    check_lowrank(g)
    print("add norm kernels ok")


def check_lowrank(g: torch.Generator) -> None:
    """The forward with a low-rank addend (an output projection's LoRA update inside the kernel):
    against fp64's residual + update + s xa B^T and its norm, every gradient, at widths over and
    under one step's columns, a rank under tl.dot's least, rows not a multiple of a program's; then
    chained to the layer's two products (``model.lora_split``) against the layer run whole and
    torch's add and norm."""
    from sweepbench.train.add_norm_kernel import AddLoRARMSNorm
    from sweepbench.train.model import LoRALinear, lora_split

    for dtype in (torch.float32, torch.bfloat16):
        for n, rank, rows in ((96, 4, 27), (300, 16, 40)):
            for trained in (True, False):
                for both in (True, False):
                    values = [torch.randn(rows, n, generator=g).to(dtype) for _ in range(4)]
                    xa = torch.randn(rows, rank, generator=g).to(dtype)
                    b = (torch.randn(n, rank, generator=g) * 0.3).to(dtype)
                    weight = torch.rand(n, generator=g).add(0.5).to(dtype)

                    def run(fn, cast: torch.dtype) -> list[torch.Tensor]:  # noqa: ANN001
                        res, upd, x, bb = (t.to(cast).requires_grad_() for t in (*values[:2], xa, b))
                        w = weight.to(cast).requires_grad_(trained)
                        out, total = fn(res, upd, x, bb, w)
                        grads = torch.autograd.grad([out, total][: 1 + both], [res, upd, x, bb, *[w][:trained]],
                                                    [t.to(cast) for t in values[2:][: 1 + both]])
                        return [out, total, *grads]

                    def textbook(r, u, x, bb, w):  # noqa: ANN001, ANN202
                        total = r + u + 2.0 * (x @ bb.t())
                        return F.rms_norm(total, (n,), w, 1e-5), total

                    ref = run(textbook, torch.float64)
                    got = run(lambda r, u, x, bb, w: AddLoRARMSNorm.apply(r, u, x, bb, w, 1e-5, 2.0), dtype)
                    tol = 1e-5 if dtype == torch.float32 else 2**-6
                    names = ("out", "total", "grad residual", "grad update", "grad xa", "grad B", "grad weight")
                    for name, r, o in zip(names, ref, got):
                        assert o.dtype == dtype and o.shape == r.shape, name
                        err, scale = (o.double() - r).abs().max().item(), r.abs().max().item()
                        assert err <= 4 * tol * scale, (name, dtype, n, rank, trained, both, err, scale)
    torch.manual_seed(0)
    layer = LoRALinear(48, 64, rank=8, alpha=16.0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(std=0.2)
    x, res, d_out = torch.randn(2, 5, 48), torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    norm_w = torch.rand(64).add(0.5)

    def chain(split: bool) -> list[torch.Tensor]:
        layer.zero_grad(set_to_none=True)
        xi, ri = x.clone().requires_grad_(), res.clone().requires_grad_()
        if split:
            pair = lora_split(xi, layer)
            assert pair is not None
            out, _ = AddLoRARMSNorm.apply(ri, *pair, layer.lora_b, norm_w, 1e-5, layer.scale)
        else:
            out = F.rms_norm(ri + layer(xi), (64,), norm_w, 1e-5)
        out.backward(d_out)
        return [out.detach(), xi.grad, ri.grad, layer.lora_a.grad, layer.lora_b.grad]

    for name, a, b in zip(("out", "grad x", "grad residual", "grad A", "grad B"), chain(True), chain(False)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)
    assert layer.weight.grad is None


def test_add_norm_kernels_match_torchs_add_and_rms_norm():
    assert run_interpreted("tests.train.test_add_norm_kernel") == "add norm kernels ok"
