"""bench/peers/torch_cp.py, the standalone twin of impl=torch_cp: it imports nothing of sweepbench,
spawns its ranks itself and writes its CSV (checked on CPU/gloo, where its attention is the
rank-local plumbing stand-in; torch's CP attention runs on CUDA only)."""

from __future__ import annotations

import ast
import csv
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "peers" / "torch_cp.py"


def test_imports_no_sweepbench() -> None:
    tree = ast.parse(SCRIPT.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "sweepbench"]


def test_spawns_two_ranks_and_writes_its_csv(tmp_path: Path) -> None:
    out = tmp_path / "peer" / "torch_cp.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), "32", "64", "--device", "cpu", "--heads", "4", "--kv-heads",
                           "2", "--head-dim", "8", "--warmup", "1", "--iters", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert [int(r["seq_len"]) for r in rows] == [32, 64]
    for r in rows:
        times = [float(x) for x in r["times_ms"].split()]
        assert len(times) == 3 and r["world_size"] == "2" and r["kv_heads"] == "2" and r["backend"] == "cudnn"
        assert abs(min(times) - float(r["min_ms"])) < 1e-3  # the CSV keeps every timed iteration
        assert float(r["min_ms"]) <= float(r["median_ms"]) <= float(r["max_ms"]) and float(r["iqr_ms"]) >= 0
        assert 0 <= float(r["max_abs_err"]) <= 2e-2  # checked against the whole sequence on one device
    assert proc.stdout.count("torch_cp W=2 L=") == 2 and "median" in proc.stdout


def test_bad_sequence_length_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "30", "--device", "cpu"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "torch_cp.py: error: sequence length 30 must be a positive multiple of 2 x ranks = 4"]


def test_an_output_off_the_whole_sequence_fails_the_run(tmp_path: Path) -> None:
    """The check compares the gathered output with one device's attention over the whole sequence:
    with a tolerance below bf16's rounding it must refuse the times (and write no CSV)."""
    out = tmp_path / "torch_cp.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), "32", "--device", "cpu", "--heads", "2", "--head-dim", "8",
                           "--iters", "1", "--atol", "1e-9", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "differs from one device's SDPA on the whole sequence" in proc.stderr
    assert not out.exists()
