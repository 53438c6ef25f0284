"""bench/gpu/trace_top.py --against on a Chrome trace made here: a step's kernels found through their
launch calls (runtime and driver API), the span, busy and idle time they leave, and the host op that
ran inside the idle gap."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _trace(path: Path, step: str) -> Path:
    events = [
        {"cat": "user_annotation", "name": step, "ts": 0, "dur": 100},
        {"cat": "gpu_user_annotation", "name": step, "ts": 0, "dur": 100},  # its GPU copy: not a second step
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 2, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 20, "dur": 30, "args": {"correlation": 1}},
        {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 15, "dur": 2, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": 70, "dur": 10, "args": {"correlation": 2}},
        # launched after the step: not its work
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150, "dur": 2, "args": {"correlation": 3}},
        {"cat": "kernel", "name": "after", "ts": 160, "dur": 10, "args": {"correlation": 3}},
        {"cat": "cpu_op", "name": "aten::item", "ts": 50, "dur": 10},
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_two_traces_side_by_side_per_step(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a.pt.trace.json.gz", "trainer_step")
    b = _trace(tmp_path / "b.pt.trace.json.gz", "ProfilerStep#7")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "trace_top.py"), str(a), "--step-name", "trainer_step",
         "--against", str(b), "--min-gap-us", "5"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line[:42].strip(): line[42:].split() for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert rows["host range of the step"] == ["0.10", "0.10", "0.00"]
    assert rows["its start to the first kernel's"] == ["0.02", "0.02", "0.00"]
    assert rows["GPU span of the step's work"] == ["0.06", "0.06", "0.00"]  # 20 to 80 us
    assert rows["GPU busy"] == ["0.04", "0.04", "0.00"]
    assert rows["GPU idle"] == ["0.02", "0.02", "0.00"]
    assert rows["kernels launched"] == ["2", "2", "0"]
    assert "(1 steps)" in proc.stdout
    assert proc.stdout.rstrip().endswith("0.01  aten::item")  # the host op inside B's idle gap


def test_a_trace_without_the_step_says_so(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a.pt.trace.json.gz", "ProfilerStep#1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "trace_top.py"), str(a), "--step-name", "trainer_step",
         "--against", str(a)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1 and proc.stderr.strip() == f"trace_top: {a} holds no step annotated 'trainer_step'"
