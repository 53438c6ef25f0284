"""bench/peers/fms_train.py, the standalone twin of impl=fms_peft and fms_foak: fms-acceleration's
plugins on transformers' own Trainer. On a CPU the bitsandbytes plugin loads its checkpoint in NF4
and the Trainer trains the adapters (foak's Triton kernels need CUDA: refused in one line)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "peers" / "fms_train.py"
TINY = ["--model", "tiny", "--seq-len", "128", "--micro-batch", "2", "--steps", "6", "--warmup", "2",
        "--device", "cpu", "--lora-rank", "8"]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)


def test_trainer_trains_the_plugins_4bit_lora_and_writes_its_row(tmp_path: Path) -> None:
    out = tmp_path / "twin" / "fms.csv"
    prof = tmp_path / "profile"
    proc = _run(tmp_path, "--plugin", "fms_peft", "--quant", "nf4", *TINY, "--out", str(out), "--profile", str(prof))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = list(csv.DictReader(out.open()))
    layers = yaml.safe_load((ROOT / "conf" / "model" / "tiny.yaml").read_text())["num_layers"]
    assert int(row["linears_4bit"]) == 7 * layers  # every block linear loaded in NF4 by the plugin
    assert (row["plugin"], row["quant"], row["lora_rank"], row["steps"]) == ("fms_peft", "nf4", "8", "6")
    lo, mid, hi = (float(row[k]) for k in ("step_min_s", "step_median_s", "step_max_s"))
    assert 0 < lo <= mid <= hi
    assert float(row["tokens_per_s"]) == 2 * 128 / mid
    assert math.isfinite(float(row["loss_first"])) and math.isfinite(float(row["loss_last"]))
    assert row["patches"] == ""  # the bitsandbytes plugin patches nothing
    assert "fms_train fms_peft tiny quant=nf4 lora=8" in proc.stdout
    # --profile: 4 more steps, the last 3 in a Chrome trace, each marked as the timer sees it; the
    # row's steps stay the timed ones
    (trace,) = prof.glob("twin.*.pt.trace.json.gz")
    events = json.load(gzip.open(trace))["traceEvents"]
    marks = [e for e in events if e.get("name") == "trainer_step" and e.get("cat") == "user_annotation"]
    assert len(marks) == 3 and all(e["dur"] > 0 for e in marks)
    assert sum(e.get("cat") == "cpu_op" and e["name"] == "aten::mm" for e in events) > 0


def test_bad_input_one_line(tmp_path: Path) -> None:
    cases = {
        ("--plugin", "fms_foak", "--device", "cpu"):
            "fms_train: --plugin fms_foak with --device cpu: foak's kernels are Triton kernels for CUDA",
        ("--plugin", "fms_peft", "--quant", "none"):
            "fms_train: --quant none with --plugin fms_peft: its plugin loads the base in 4-bit; use --quant nf4",
        ("--plugin", "peft"): "fms_train: --plugin 'peft': valid: fms_peft, fms_foak",
        ("--plugin", "fms_peft", "--steps", "3", "--warmup", "3"):
            "fms_train: --warmup 3 with --steps 3: needs 0 <= warmup < steps",
    }
    for args, line in cases.items():
        proc = _run(tmp_path, *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [line], (args, proc.stderr)
