"""bench/gpu/check_sdpa_backends.py, the check that caught the efficient backward's layout bug on the GPU,
runs on the CPU backend too: every backend the engine registers for the device agrees with an fp32
matmul/softmax reference in out, LSE and all three gradients."""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_check_sdpa_backends_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu/check_sdpa_backends.py"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(tmp_path / "sdpa_backends.csv")))
    assert {r["backend"] for r in rows} == {"cpu_flash"}
    assert len(rows) == 4 and all(r["ok"] == "True" for r in rows)
    assert all(float(r[k]) < 1e-5 for r in rows for k in ("out", "lse", "dq", "dk", "dv"))
