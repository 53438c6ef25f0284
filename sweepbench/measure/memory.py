"""Peak memory of a rank: torch's allocator peaks on GPU, NVML's used memory, host RSS."""

from __future__ import annotations

import resource
from typing import Any

import torch

from sweepbench.measure.gpu_state import nvml_handle


def reset_peaks(device: torch.device) -> None:
    """Start the peaks afresh: torch's allocator peaks on a GPU, the host's resident set peak."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    reset_host_peak()


def reset_host_peak() -> None:
    """The process's resident set peak (VmHWM) back to its current size, so that a process that
    runs more than one job (kept ranks) reports each job's own peak; where Linux does not allow it
    the peak stays the process's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def status_bytes(field: str) -> int | None:
    """A size /proc/self/status gives this process (``VmHWM``, ``RssAnon``, ..), in bytes; None
    where it says nothing of it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_peak_rss_bytes() -> int:
    """The resident set peak since the last ``reset_host_peak`` (VmHWM), else the process's
    (``ru_maxrss``)."""
    peak = status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def nvml_used_bytes(device: torch.device) -> int | None:
    """Memory in use on ``device``'s GPU as NVML counts it (every process's, CUDA contexts included);
    None on a CPU or where NVML is missing or unusable. The GPU is found by its UUID
    (``gpu_state.nvml_handle``): NVML numbers every GPU of the node and ignores
    CUDA_VISIBLE_DEVICES, so torch's index named another GPU wherever that was set."""
    handle = nvml_handle(device)
    if handle is None:
        return None
    try:
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()  # the init nvml_handle made
    except Exception:  # NVML not usable: the number is simply not reported
        return None


def memory_peaks(device: torch.device) -> dict[str, Any]:
    """Peaks since the last reset; ``None`` where the device has no such counter."""
    on_gpu = device.type == "cuda"
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if on_gpu else None,
        "nvml_used_bytes": nvml_used_bytes(device) if on_gpu else None,
        "host_max_rss_bytes": host_peak_rss_bytes(),
    }
