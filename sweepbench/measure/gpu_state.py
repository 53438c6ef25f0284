"""How the GPU ran while a job timed it: SM clock, power draw, temperature and what held the clock
down (NVML's clock-event reasons), sampled beside the timed samples of every benchmark.

A GPU at its power cap lowers its clock as its draw rises: steps that never let it idle run
slower than the same steps timed one at a time (docs/benchmarks/train.md, Timing), and two jobs'
times differ with the GPU's temperature and draw as well as with their work. A job's record says
how the GPU ran it, so that a reader can tell.

How a job records it: its rank opens a :class:`StateSampler` on its GPU (``begin``) before the
benchmark runs, the timing loops (``measure.timing``) sample only while they time (``timed``), and
the rank reads the summary as the benchmark ends (``finish``): metrics.json's
``gpu_state.per_rank``, and four results.csv columns (``columns``). This module imports neither
torch nor NVML at import time: the driver's aggregation reads ``columns`` from it."""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from sweepbench.measure.periodic import Periodic

if TYPE_CHECKING:
    import torch

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
    power_instant: bool = True  # power_w is the board's draw now, not NVML's average over its window


# NVML's field value types (nvml.h: nvmlValueType_t) and the union member holding each
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def _power_w(handle: Any) -> tuple[float, bool]:
    """The board's power in W and whether it is the instant draw: NVML's instant field
    (``NVML_FI_DEV_POWER_INSTANT``) where the driver gives it, since ``nvmlDeviceGetPowerUsage``
    on Ampere and newer (GA100 aside) returns its average over the last second, which reads a loop
    shorter than that as partly the idle before it; that average where the field is not given."""
    import pynvml

    try:
        v = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])[0]
        member = _VALUE_MEMBERS.get(int(v.valueType))
        if v.nvmlReturn == pynvml.NVML_SUCCESS and member is not None:
            return float(getattr(v.value, member)) / 1000, True
    except (pynvml.NVMLError, AttributeError):
        pass
    return pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, False


def read_sample(handle: Any) -> GpuSample | None:
    """One reading of the GPU behind an NVML ``handle``; None where NVML cannot give it."""
    import pynvml

    try:
        power_w, instant = _power_w(handle)
        return GpuSample(
            sm_mhz=int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            power_w=power_w,
            temperature_c=int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            reasons=int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            power_instant=instant,
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
        # instant: the draw at each reading; average: NVML's average over its window (about a second)
        "power_reading": "instant" if all(s.power_instant for s in samples) else "average",
        "temperature_c_min": min(temps),
        "temperature_c_max": max(temps),
        "limited_pct": {
            name: 100 * sum(bool(s.reasons & bit) for s in samples) / len(samples) for name, bit in LIMITS.items()
        },
    }


def nvml_handle(device: "torch.device") -> Any | None:
    """NVML's handle of the GPU ``device`` names; None on a CPU or where NVML is missing or unusable."""
    if device.type != "cuda":
        return None
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        # the rank's own GPU by its UUID: NVML numbers every GPU of the node and ignores
        # CUDA_VISIBLE_DEVICES, so torch's index would name another GPU wherever that is set
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # NVML missing or unusable: the record is simply None
        return None


class StateSampler(Periodic):
    """Reads the GPU behind ``handle`` every ``period_s`` while resumed (as often as the timing loops
    ask) and once as it pauses; ``summary()`` summarises every reading."""

    def __init__(self, handle: Any, *, period_s: float = 0.02) -> None:
        super().__init__(period_s=period_s, name="gpu-state")
        self.handle = handle
        self.samples: list[GpuSample] = []

    def read(self) -> None:
        sample = read_sample(self.handle)
        if sample is not None:
            self.samples.append(sample)

    def summary(self) -> dict[str, Any] | None:
        return summarize_gpu_state(self.samples, limit_w=power_limit_w(self.handle))


# the sampler of the job this process's rank runs (``begin`` .. ``finish``); None outside a job or
# where the rank has no GPU NVML can read
_job: StateSampler | None = None


def begin(device: "torch.device") -> None:
    """Start a job's record on this rank: its timed loops are read from now until ``finish``."""
    global _job
    handle = nvml_handle(device)
    _job = StateSampler(handle) if handle is not None else None


@contextmanager
def timed() -> Iterator[None]:
    """Around a timing loop's timed samples: the job's GPU is read while they run (nothing outside a
    job or without NVML)."""
    sampler = _job
    if sampler is None:
        yield
        return
    sampler.resume()
    try:
        yield
    finally:
        sampler.pause()


def finish() -> dict[str, Any] | None:
    """The job's record on this rank (``summarize_gpu_state`` of every reading taken while its loops
    timed), and the end of it; None on a CPU, without NVML, or where nothing was timed."""
    global _job
    sampler, _job = _job, None
    if sampler is None:
        return None
    sampler.pause()
    return sampler.summary()


def _most(have: list[dict[str, Any]], key: str) -> Any:
    return max((g[key] for g in have if g.get(key) is not None), default=None)


def columns(per_rank: list[dict[str, Any] | None]) -> dict[str, Any]:
    """results.csv's view of a job's record: the lowest rank's median SM clock, and the most of any
    rank's median power, share of readings at the power cap and temperature; None on CPUs, without
    NVML, or for a job recorded before it had one."""
    have = [g for g in per_rank if isinstance(g, dict)]
    return {
        "gpu_sm_mhz_median": min((g["sm_mhz_median"] for g in have), default=None),
        "gpu_power_w_median": _most(have, "power_w_median"),
        "gpu_power_capped_pct": max((g["limited_pct"]["power_cap"] for g in have), default=None),
        "gpu_temperature_c_max": _most(have, "temperature_c_max"),
    }
