"""The compute limits a training step is measured against.

Two of them: the bf16 dense peak of the GPU from a table keyed by its name (what MFU divides by,
as torchtitan does), and a matmul ceiling measured by the job itself on its own devices before it
trains (the most a large matmul reaches there, the "limit measured in the same job"). On a CPU the
table has no entry: MFU is taken against the measured ceiling, and the job says so."""

from __future__ import annotations

import torch
import torch.distributed as dist

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
    """(peak FLOP/s or None, the device's name)."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_FLOPS if key in name), None), name


def matmul_ceiling(device: torch.device, dtype: torch.dtype, *, warmup: int = 3, iters: int = 10) -> float:
    """FLOP/s of an n x n x n matmul on this rank (bf16 8192^3 on a GPU; on a CPU 512^3 in the
    training dtype), the best iteration, averaged over the ranks (each runs on its own device)."""
    on_gpu = device.type == "cuda"
    n = 8192 if on_gpu else 512
    dt = torch.bfloat16 if on_gpu else dtype
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    out = torch.empty(n, n, device=device, dtype=dt)
    stats = summarize(time_iterations(lambda: torch.mm(a, b, out=out), warmup=warmup, iters=iters, device=device))
    best = torch.tensor(2 * n ** 3 / stats["min_s"], dtype=torch.float64, device=device)
    dist.all_reduce(best)
    return best.item() / dist.get_world_size()
