"""How the GPU ran a job's timed steps (measure/gpu_state.py): NVML's readings summarised, each
clock-event reason that lowers the clock counted by its bit; without NVML (this machine) nothing is
read and nothing summarised."""

from __future__ import annotations

import pytest

from sweepbench.measure.gpu_state import GpuSample, power_limit_w, read_sample, summarize_gpu_state

# readings of an H200 in a fused 1B LoRA sweep (docs/results/runs/
# train_h200x1_2026-11-29_back_to_back_clocks/clocks.csv.gz): idle before the job (0x1), boosting with
# no reason, at the power cap (0x4); and the last again with the software thermal bit (0x20) as well,
# which that log never showed
READINGS = [GpuSample(345, 80.31, 43, 0x1), GpuSample(1980, 81.71, 43, 0x0), GpuSample(1695, 654.85, 63, 0x4),
            GpuSample(1710, 695.18, 65, 0x4), GpuSample(1620, 676.59, 67, 0x4), GpuSample(1620, 676.59, 67, 0x24)]


def test_summary_of_readings() -> None:
    s = summarize_gpu_state(READINGS, limit_w=700.0)
    assert s is not None
    assert (s["samples"], s["sm_mhz_median"], s["sm_mhz_min"], s["sm_mhz_max"]) == (6, 1657.5, 345, 1980)
    assert (s["power_w_median"], s["power_w_max"], s["power_limit_w"]) == (pytest.approx(665.72), 695.18, 700.0)
    assert (s["temperature_c_min"], s["temperature_c_max"]) == (43, 67)
    assert s["power_reading"] == "instant"
    # one reading where the driver gave only NVML's windowed average: the summary says so
    mixed = summarize_gpu_state([*READINGS[:-1], GpuSample(1620, 676.59, 67, 0x24, power_instant=False)], limit_w=700.0)
    assert mixed is not None and mixed["power_reading"] == "average"
    # idle (0x1) holds no clock down; the power cap in 4 of 6 readings, software thermal in 1
    assert s["limited_pct"] == pytest.approx({"power_cap": 400 / 6, "hw_slowdown": 0.0, "sw_thermal": 100 / 6,
                                              "hw_thermal": 0.0, "hw_power_brake": 0.0})


def test_no_readings_no_summary() -> None:
    assert summarize_gpu_state([], limit_w=None) is None


def test_without_nvml_nothing_is_read() -> None:
    # no GPU and no NVML library here: NVML refuses, and the reading is None rather than an error
    assert read_sample(None) is None and power_limit_w(None) is None


def test_results_columns_of_a_jobs_ranks() -> None:
    from sweepbench.measure.gpu_state import columns

    hot = summarize_gpu_state(READINGS, limit_w=700.0)
    cool = summarize_gpu_state(READINGS[:2], limit_w=700.0)  # idle and boosting: never at the cap
    assert hot is not None and cool is not None
    # the lowest rank's median clock; the most of any rank's median power, share at the cap, temperature
    assert columns([hot, cool]) == {"gpu_sm_mhz_median": 1162.5, "gpu_power_w_median": pytest.approx(665.72),
                                    "gpu_power_capped_pct": pytest.approx(400 / 6), "gpu_temperature_c_max": 67}
    empty = dict.fromkeys(("gpu_sm_mhz_median", "gpu_power_w_median", "gpu_power_capped_pct",
                           "gpu_temperature_c_max"))
    assert columns([None, None]) == empty and columns([]) == empty


def test_a_job_on_a_cpu_records_nothing() -> None:
    import torch

    from sweepbench.measure import gpu_state

    gpu_state.begin(torch.device("cpu"))
    with gpu_state.timed():
        torch.ones(4).sum()
    assert gpu_state.finish() is None and gpu_state.finish() is None


def test_a_sweeps_closing_line_from_committed_gpu_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's closing line on how the GPUs ran, from the jobs of a committed one-H200 run (their
    metrics.json as the sweep read them back): the spread of the jobs' median SM clocks and of the share
    of readings at the power cap. Jobs with no record (a CPU, or recorded before it) print nothing."""
    import json
    from pathlib import Path

    import pandas as pd

    from sweepbench.sweep.aggregate import job_row
    from sweepbench.sweep.driver import print_gpu_state

    runs = Path(__file__).parents[2] / "docs/results/runs"

    def table(run: str) -> pd.DataFrame:
        rows = [{**job_row(json.loads(f.read_text())), "this_run": True} for f in sorted((runs / run).glob("*/metrics.json"))]
        assert rows, run
        return pd.DataFrame(rows)

    print_gpu_state(table("train_h200x1_2026-12-01_fms_foak_shared_samplers"))
    assert capsys.readouterr().out == (
        "sweepbench: GPUs in the timed samples (4 jobs): median SM clock 1665 MHz to 1770 MHz, at the power cap in "
        "100% of readings (metrics.json gpu_state; a gap of a few percent between jobs can be the clock's)\n")
    print_gpu_state(table("collective_h200x1_2026-12-01_gpu_state_ab_before_r1"))  # the code before the record
    assert capsys.readouterr().out == ""


def test_nvml_memory_is_read_for_a_gpu_only() -> None:
    """The end-of-job NVML memory figure opens the rank's GPU by its UUID, as the state record does
    (NVML ignores CUDA_VISIBLE_DEVICES): on a CPU there is no GPU to open, and the figure is None."""
    import torch

    from sweepbench.measure.memory import memory_peaks, nvml_used_bytes

    assert nvml_used_bytes(torch.device("cpu")) is None
    peaks = memory_peaks(torch.device("cpu"))
    assert peaks["nvml_used_bytes"] is None and peaks["peak_allocated_bytes"] is None
    assert peaks["host_max_rss_bytes"] > 0
