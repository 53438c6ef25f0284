"""The LSE merge's Triton kernel (``attention/merge_kernel.py``, the CUDA path of ``accum.merge_``), run by
Triton's interpreter on CPU tensors: it writes what the eager merge writes, into full tensors and into row
slices of an accumulator, for fp32 and bf16 outputs, rows with no keys yet (LSE -inf) included."""

import torch

from ..conftest import run_interpreted


def check() -> None:
    from sweepbench.attention import merge_kernel
    from sweepbench.attention.accum import merge_

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (slice(None), slice(64, 128)):
            out = torch.randn(2, 3, 128, 24, generator=g).to(dtype)
            lse = torch.randn(2, 3, 128, generator=g)
            lse[0, 0, 70] = lse[1, 2, 127] = float("-inf")  # no keys merged into these rows yet
            block_out = torch.randn(2, 3, 128, 24, generator=g)[:, :, rows].to(dtype).contiguous()
            block_lse = torch.randn(2, 3, 128, generator=g)[:, :, rows].contiguous()
            want, want_lse = out.clone(), lse.clone()
            merge_(want[:, :, rows], want_lse[:, :, rows], block_out, block_lse)
            got, got_lse = out.clone(), lse.clone()
            assert merge_kernel.fits(got[:, :, rows], got_lse[:, :, rows], block_out, block_lse)
            merge_kernel.merge(got[:, :, rows], got_lse[:, :, rows], block_out, block_lse)
            # one rounding of the same fp32 math: fp32 to its rounding, bf16 within one unit in the last place
            rtol = 2e-6 if dtype == torch.float32 else 2 ** -7
            torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=1e-6)
            torch.testing.assert_close(got_lse, want_lse, rtol=1e-6, atol=1e-6)
            assert not torch.equal(got, out)
    assert not merge_kernel.fits(out.transpose(-1, -2), lse, block_out, block_lse)  # a strided head dim: eager
    print("merge kernel ok")


def test_merge_kernel_matches_the_eager_merge():
    assert run_interpreted("tests.attention.test_merge_kernel") == "merge kernel ok"
