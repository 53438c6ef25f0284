"""The compute limits a training step is measured against.

Two of them: the bf16 dense peak of the GPU from a table keyed by its name (what MFU divides by,
as torchtitan does, for every precision, fp8 included), and a matmul ceiling
measured by the job itself on its own devices before it trains (the most a large matmul reaches
there, the "limit measured in the same job"). On a CPU the
table has no entry: MFU is taken against the measured ceiling, and the job says so."""

from __future__ import annotations

import torch

from sweepbench.measure import summarize, time_iterations

# bf16 dense (no sparsity) peak FLOP/s, by a substring of torch.cuda.get_device_name(); the first
# match wins, so the more specific names come first
BF16_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM (torchtitan's number)
    ("H200", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("GB200", 2500e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
)


def bf16_peak(device: torch.device) -> tuple[float | None, str]:
    """(the bf16 dense peak FLOP/s or None, the device's name): MFU's denominator for every precision
    (fp32, mixed and fp8 included), so that MFUs compare across precisions."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_FLOPS if key in name), None), name


def _matmul_flops(n: int, dtype: torch.dtype, device: torch.device, warmup: int, iters: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    stats = summarize(
        time_iterations(lambda: torch.mm(a, b, out=out), warmup=warmup, iters=iters, device=device, record_gpu=False)
    )
    return 2 * n**3 / stats["min_s"]  # the best iteration of the slowest rank


def _fp8_matmul_flops(n: int, device: torch.device, warmup: int, iters: int) -> float:
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device=device)
    stats = summarize(
        time_iterations(
            lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16),
            warmup=warmup,
            iters=iters,
            device=device,
            record_gpu=False,
        )
    )
    return 2 * n**3 / stats["min_s"]


def matmul_ceiling(
    device: torch.device, dtype: torch.dtype, *, warmup: int = 3, iters: int = 10, fp8: bool = False
) -> float:
    """FLOP/s of an n x n x n matmul on each rank at once: bf16 8192^3 on a GPU (float8 with ``fp8``,
    through torch._scaled_mm); on a CPU 512^3,
    the faster of fp32 and the training dtype (a CPU's bf16 matmul can be slower than its fp32)."""
    if device.type == "cuda" and fp8:  # float8 linears: what a float8 matmul reaches
        return _fp8_matmul_flops(8192, device, warmup, iters)
    if device.type == "cuda":
        return _matmul_flops(8192, torch.bfloat16, device, warmup, iters)
    return max(
        _matmul_flops(512, dt, device, warmup, iters) for dt in dict.fromkeys((torch.float32, dtype))
    )  # same order on every rank
