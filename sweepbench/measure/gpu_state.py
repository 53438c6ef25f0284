"""How the GPU ran while a job timed it: SM clock, power draw, temperature and what held the clock
down (NVML's clock-event reasons), sampled beside the timed steps.

A GPU at its power cap lowers its clock as its draw rises: steps that never let it idle run
slower than the same steps timed one at a time (docs/benchmarks/train.md, Timing), and two jobs'
times differ with the GPU's temperature and draw as well as with their work. A job's record says
how the GPU ran it, so that a reader can tell."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

# the clock-event reasons (nvml.h: nvmlClocksEventReason*) that lower the clock, by the name the
# record gives each
LIMITS = {
    "power_cap": 0x4,  # SwPowerCap: the board's power limit
    "hw_slowdown": 0x8,  # HwSlowdown
    "sw_thermal": 0x20,  # SwThermalSlowdown
    "hw_thermal": 0x40,  # HwThermalSlowdown
    "hw_power_brake": 0x80,  # HwPowerBrakeSlowdown
}


@dataclass(frozen=True)
class GpuSample:
    sm_mhz: int
    power_w: float
    temperature_c: int
    reasons: int  # NVML's clock-event reason bits


def read_sample(handle: Any) -> GpuSample | None:
    """One reading of the GPU behind an NVML ``handle``; None where NVML cannot give it."""
    import pynvml

    try:
        return GpuSample(
            sm_mhz=int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            temperature_c=int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            reasons=int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        )
    except pynvml.NVMLError:
        return None


def power_limit_w(handle: Any) -> float | None:
    import pynvml

    try:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
    except pynvml.NVMLError:
        return None


def summarize_gpu_state(samples: list[GpuSample], *, limit_w: float | None) -> dict[str, Any] | None:
    """The samples' SM clock (median, min, max), power (median, max, against ``limit_w``),
    temperature range, and the percentage of samples in which each of :data:`LIMITS` held the
    clock down; None without samples."""
    if not samples:
        return None
    clocks, power = [s.sm_mhz for s in samples], [s.power_w for s in samples]
    temps = [s.temperature_c for s in samples]
    return {
        "samples": len(samples),
        "sm_mhz_median": statistics.median(clocks),
        "sm_mhz_min": min(clocks),
        "sm_mhz_max": max(clocks),
        "power_w_median": statistics.median(power),
        "power_w_max": max(power),
        "power_limit_w": limit_w,
        "temperature_c_min": min(temps),
        "temperature_c_max": max(temps),
        "limited_pct": {
            name: 100 * sum(bool(s.reasons & bit) for s in samples) / len(samples) for name, bit in LIMITS.items()
        },
    }
