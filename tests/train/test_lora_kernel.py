"""The LoRA backward's one-pass kernel (``train/lora_kernel.py``, CUDA's path in ``_LoRAGroup``), run by
Triton's interpreter on CPU tensors: s g B written into a column block of a wider matrix and B's
gradient s g^T (x A^T) give what the two GEMMs give, in bf16 and fp16, at ranks 16 and 32, with the
rows and columns not multiples of the kernel's blocks, several column blocks and row ranges (partials
added), x A^T a column block of the group's [tokens, sum of ranks] product, and B's gradient skipped
where it is not wanted."""

import torch

from ..conftest import run_interpreted


def check() -> None:
    from sweepbench.train.lora_kernel import low_rank_grads, usable

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for rows, n_out, rank, blocks in ((70, 96, 16, (16, 32, 6)), (33, 40, 32, (16, 64, 4)), (50, 24, 16, (64, 256, 264))):
            g = torch.randn(rows, n_out, generator=gen).to(dtype)
            b = (torch.randn(n_out, rank, generator=gen) / 4).to(dtype)
            xa_all = torch.randn(rows, rank + 16, generator=gen).to(dtype)  # this layer's columns after another's 16
            xa = xa_all[:, 16:]
            scale = 2.5
            assert usable(g, b)
            for want_b in (True, False):
                wide = torch.full((rows, rank + 16), 7.0, dtype=dtype)
                grad_b = low_rank_grads(g, b, xa, scale, wide[:, 16:], want_b=want_b, block_rows=blocks[0],
                                        block_cols=blocks[1], programs=blocks[2])
                want_gxa = scale * g.double() @ b.double()
                tol = 2**-7 if dtype == torch.bfloat16 else 2**-10  # one rounding to the dtype, of the largest value
                err = (wide[:, 16:].double() - want_gxa).abs().max().item()
                assert err <= tol * want_gxa.abs().max().item(), (dtype, rows, n_out, rank, err)
                assert (wide[:, :16] == 7).all()  # the other layer's columns untouched
                if want_b:
                    want_gb = scale * g.double().t() @ xa.double()
                    assert grad_b is not None and grad_b.dtype == dtype and grad_b.shape == (n_out, rank)
                    err = (grad_b.double() - want_gb).abs().max().item()
                    assert err <= tol * want_gb.abs().max().item(), (dtype, rows, n_out, rank, err)
                else:
                    assert grad_b is None
    assert not usable(torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))  # rank 8
    assert not usable(torch.zeros(4, 8), torch.zeros(8, 16))  # fp32: the GEMMs
    print("lora kernel ok")


def test_lora_kernel_gives_the_two_gemms_products():
    assert run_interpreted("tests.train.test_lora_kernel") == "lora kernel ok"
