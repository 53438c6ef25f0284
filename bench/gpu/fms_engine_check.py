"""The fine-tune recipe knobs through the train engine's own job function (run_training: verify,
time, measure) on one GPU, without the sweep driver: for a GPU machine that has torch,
transformers, peft, bitsandbytes, liger-kernel and omegaconf but not the rest of sweepbench's
dependencies. One JSON line per case; the same code path and numbers as a benchmark=train job.

    python bench/gpu/fms_engine_check.py conf/model/llama3_1b.yaml OUT.json "impl=ours" "impl=hf lora_rank=16" ...

Each case is benchmark.* overrides (space-separated) on the train engine's knobs (``TrainKnobs``
defaults) at seq 4096, micro-batch 4, bf16, 2 warm-up and 6 timed steps (``warmup=N iters=N`` in a
case set its own)."""
from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

DEFAULTS = {"seq_len": 4096, "micro_batch": 4, "precision": "bf16"}
STEPS = {"warmup": 2, "iters": 6}
LAYOUT = {"layout": "tp1", "tp": 1, "pp": 1, "ep": 1, "dp": 1, "cp": 1}


def load(path: str) -> dict[str, Any]:
    d = OmegaConf.to_container(OmegaConf.load(path))
    d.pop("defaults", None)
    return d


def value(v: str) -> Any:
    if v in ("true", "false"):
        return v == "true"
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def run_case(line: str, *, model: dict[str, Any]) -> dict[str, Any]:
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.config import TrainJob, TrainKnobs
    from sweepbench.train.run import run_training

    given = {k: value(v) for k, v in (kv.split("=", 1) for kv in line.split())}
    steps = {k: given.pop(k, n) for k, n in STEPS.items()}  # warmup=/iters= in a case: its step counts
    knobs = TrainKnobs(**{**DEFAULTS, **given})
    shape = ModelShape.from_config({**model, "seq_len": knobs.seq_len})
    job = TrainJob(knobs=knobs, **steps, model=shape, **LAYOUT)
    t0 = time.time()
    try:
        r = run_training(job, rank=0, device=torch.device("cuda", 0), job_dir=None)
    except Exception as e:  # noqa: BLE001 -- one case's failure is reported, the others still run
        return {"case": line, "ok": False, "error": f"{type(e).__name__}: {e}"[:600], "tb": traceback.format_exc()[-1500:]}
    return {"case": line, "ok": True, "tok_s": round(r["tokens_per_s"]),
            "mfu": round(100 * r["achieved_flops"] / r["peak_flops"], 1), "median_s": r["stats"]["median_s"],
            "iqr_s": r["stats"]["iqr_s"], "ref": r["reference_losses"], "got": r["verified_losses"],
            "err": r["verify_max_rel_err"], "loss_last": r["last_loss"],
            "peak_alloc_gib": r["memory"].get("peak_allocated_bytes", 0) / 2 ** 30,
            "nvml_gib": (r["memory"].get("nvml_peak_bytes") or 0) / 2 ** 30, "recipe": r["recipe"],
            "wall_s": round(time.time() - t0)}


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    model = load(sys.argv[1])
    out = []
    for line in sys.argv[3:]:
        row = run_case(line, model=model)
        print(json.dumps(row), flush=True)
        out.append(row)
        gc.collect()
        torch.cuda.empty_cache()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
