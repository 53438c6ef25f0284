"""The W=8 attention cases kept as data (bench/gpu/attention_8gpu.yaml: dense at cp8 and the seed's
dilated grid at ring 8) run unchanged at tiny size on gloo with 8 ranks, so that an 8-GPU machine runs
the same file: every job ok, verified against the single-device reference, at world size 8."""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_w8_cases_run_at_tiny_size_on_eight_gloo_ranks(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu/run_cases.py"), str(ROOT / "bench/gpu/attention_8gpu.yaml"),
                           "--cpu", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {name: list(csv.DictReader(open(tmp_path / name / "results.csv")))
            for name in ("attention_cp8", "ring_dilated_seed_cp8")}
    assert {(r["impl"], r["pattern"]) for r in rows["attention_cp8"]} == {("ring", "dense"), ("ulysses", "dense")}
    assert {(r["impl"], r["pattern"]) for r in rows["ring_dilated_seed_cp8"]} == {("ring", "dilated")}
    for r in [*rows["attention_cp8"], *rows["ring_dilated_seed_cp8"]]:
        assert (r["status"], r["verified"], r["world_size"], r["backend"]) == ("ok", "True", "8", "gloo"), r
        assert float(r["total_median_ms"]) > 0 and float(r["efficiency"]) > 0
