"""Memory of a training rank, measured two ways, as fms-acceleration's benchmark does.

torch's allocator: peak active / allocated / reserved bytes, allocator retries (cudaMalloc retried
after freeing its cache) and OOMs. NVML: the device's used memory, sampled by a thread every few
milliseconds while the steps run; reported as the peak minus the level the job started at (what
the job itself added: NCCL buffers and the allocator's cache included; the CUDA context, made as the
rank starts, not; a kept rank starts a job with its allocator's cache handed back), and by how much
it falls short of the allocator's reserved peak (``nvml_shortfall_bytes``: only where the job
reused memory reserved before it started, a warning past a few MiB). On a CPU neither
exists: both are None, and the host's peak RSS is reported instead, with the peak of the
process's anonymous memory above the job's start (``HostSampler``: the job's own tensors)."""

from __future__ import annotations

import resource

import torch

from sweepbench.measure.gpu_state import nvml_handle
from sweepbench.measure.periodic import Periodic
from sweepbench.measure.memory import status_bytes

GIB = float(1 << 30)


class NvmlSampler(Periodic):
    """``start()`` records the starting level; while running, samples used memory every
    ``period_s`` (and once as it pauses: steps shorter than the period are sampled too, the
    allocator's reserved memory not shrinking while they run); ``peak_above_start()`` is the peak
    minus the starting level (bytes or None). (How the GPU ran the timed steps, its clock, power and
    temperature, is every benchmark's record: measure/gpu_state.py.)"""

    def __init__(self, device: torch.device, *, period_s: float = 0.005) -> None:
        super().__init__(period_s=period_s, name="nvml-memory")
        self.handle = nvml_handle(device)
        self.start_level: int | None = self._used()
        self.peak: int | None = self.start_level

    def _used(self) -> int | None:
        if self.handle is None:
            return None
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def read(self) -> None:
        used = self._used()
        if used is not None and (self.peak is None or used > self.peak):
            self.peak = used

    def resume(self) -> None:
        if self.handle is not None:  # nothing to sample on a CPU or without NVML
            super().resume()

    def peak_above_start(self) -> int | None:
        if self.peak is None or self.start_level is None:
            return None
        return self.peak - self.start_level


# what NVML's figure may fall short of the allocator's by: a few MiB of small blocks reserved before
# the job and reused by it; beyond this, the job reused memory held before it started
NVML_SHORTFALL_SLACK = 64 << 20


def nvml_shortfall(nvml_above_start: int | None, peak_reserved: int | None) -> int | None:
    """How far a job's NVML peak above its start falls below torch's reserved peak over the job (0
    where it does not): every byte the allocator reserves is device memory NVML counts, so NVML's
    figure is the smaller only where the job reused memory reserved before it started, which NVML
    saw at the start and never again, and then it undercounts the job. None where either is."""
    if nvml_above_start is None or peak_reserved is None:
        return None
    return max(0, peak_reserved - nvml_above_start)


def anon_rss_bytes() -> int | None:
    """The process's anonymous resident memory (its heap: tensors, not the libraries' code pages
    that the first use of each kernel maps in); None where /proc says nothing of it."""
    return status_bytes("RssAnon")


class HostSampler(Periodic):
    """On a CPU: the process's anonymous memory, sampled by a thread every ``period_s`` from
    ``start()`` to ``stop()``; ``peak_above_start()`` is what the job added at its peak (bytes or
    None on a GPU, where the allocator's and NVML's numbers say it)."""

    def __init__(self, device: torch.device, *, period_s: float = 0.005) -> None:
        super().__init__(period_s=period_s, name="host-memory")
        self.on = device.type == "cpu" and anon_rss_bytes() is not None
        self.start_level = anon_rss_bytes() if self.on else None
        self.peak = self.start_level
        if self.on:
            self.resume()

    def read(self) -> None:
        used = anon_rss_bytes()
        if used is not None and self.peak is not None and used > self.peak:
            self.peak = used

    def stop(self) -> int | None:
        """Stop sampling; the peak above the start (bytes), or None."""
        self.pause()
        if self.peak is None or self.start_level is None:
            return None
        return self.peak - self.start_level


def reset_torch_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def torch_memory(device: torch.device) -> dict[str, int | None]:
    """Allocator peaks since the last reset, retries and OOMs (None on a CPU)."""
    if device.type != "cuda":
        return dict.fromkeys(
            ("peak_active_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "alloc_retries", "ooms")
        )
    s = torch.cuda.memory_stats(device)
    return {
        "peak_active_bytes": s.get("active_bytes.all.peak", 0),
        "peak_allocated_bytes": s.get("allocated_bytes.all.peak", 0),
        "peak_reserved_bytes": s.get("reserved_bytes.all.peak", 0),
        "alloc_retries": s.get("num_alloc_retries", 0),
        "ooms": s.get("num_ooms", 0),
    }


def current_bytes(device: torch.device) -> int:
    """What this rank holds now: torch's allocated bytes on a GPU, the process's RSS on a CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
