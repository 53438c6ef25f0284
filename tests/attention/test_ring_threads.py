"""bench/gpu/ring_threads.py, the check of the W-rank ring on one GPU's kernels (ranks as threads), runs on the
CPU backend too: it passes on the engine, and fails when an exchange delivers wrong bytes."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gpu/ring_threads.py"
ENV = {"DEVICE": "cpu", "BACKEND": "cpu_flash", "KVH": "8"}


def test_ring_threads_cpu():
    for w in ("2", "4"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "128"], capture_output=True, text=True, cwd=ROOT,
                              timeout=300, env={**os.environ, **ENV, "W": w, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.strip() == f"ring W={w} threads seq=128 kvh=8 cpu_flash causal=True: ok"


def test_ring_threads_catches_a_wrong_exchange(monkeypatch):
    spec = importlib.util.spec_from_file_location("ring_threads", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    real = mod.ThreadComm.ring_exchange

    def garbled(self, send, recv, *, reverse=False):
        done = real(self, send, recv, reverse=reverse)
        for r in (recv if isinstance(recv, tuple) else (recv,)):
            r.mul_(1.5)
        return done

    monkeypatch.setattr(mod.ThreadComm, "ring_exchange", garbled)
    monkeypatch.setenv("DEVICE", "cpu")
    errors = mod.run(128, 2, 8, "cpu_flash", True)
    assert errors and all(e.split(":")[0] in ("out", "dq", "dk", "dv") for e in errors), errors
