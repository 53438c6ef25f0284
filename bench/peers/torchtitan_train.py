"""torchtitan's own Trainer on the train benchmark's case, without sweepbench's harness: the standalone
twin of ``benchmark.impl=torchtitan``, timed by torchtitan's own log lines (its ``tps``, tokens per
second per GPU).

    python bench/peers/torchtitan_train.py --model llama3_8b --seq-len 8192 --layout dp2 --ac selective \\
        --compile --precision bf16 --steps 20 --out titan_dp2.csv      # runs torchrun on 2 GPUs itself

GPU only: torchtitan 0.2.2 takes its device from CUDA (``tools.utils.device_type`` falls back to
"cuda", and its memory monitor and peak-FLOPs lookup read ``torch.cuda``), so there is no CPU/gloo
run of its Trainer; the harness's peer (``sweepbench/train/titan_peer.py``) is what the CPU tests run.

Data: every torchtitan dataset reads files its wheel does not ship (``c4_test`` and the tokenizer
are files of torchtitan's repository, ``tests/assets``; the others download), so the twin registers
a TrainSpec (torchtitan's extension point) that is llama3's with the case's shape as its one flavour,
no tokenizer, and a dataloader — torchtitan's ``ParallelAwareDataloader`` — over the harness's
synthetic token stream (``sweepbench.train.data.SyntheticTask``: this dp rank's rows of each step).
Everything else is torchtitan's Trainer as its ``train.py`` runs it, configured by its own flags
(``ConfigManager``), pinned as the harness's peer is where its config allows: no loss parallel, the
blocks compiled and not the loss, op-level selective AC without RNG state, bf16 weights for bf16
(``training.dtype``) or fp32 masters for mixed, and attention through plain SDPA, whose backend
torch picks as for the harness (``--sdpa titan`` keeps torchtitan's priority, cuDNN then flash). Unlike the peer its step also clips gradients
(norm 1.0) and steps a warm-up LR schedule, as torchtitan always does.

Prints the median ``tps`` of the steps after --warmup (and torchtitan's own tflops/mfu/memory of
the last step); --out gets a CSV row."""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG = re.compile(r"step:\s*(\d+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?tflops:\s*([\d.,]+).*?mfu:\s*([\d.]+)%")
COLUMNS = [
    "model",
    "layout",
    "seq_len",
    "micro_batch",
    "global_batch",
    "ac",
    "compile",
    "precision",
    "sdpa",
    "steps",
    "warmup",
    "tokens_per_s_per_gpu",
    "tps_per_step",
    "tflops",
    "mfu_pct",
    "memory_gib",
]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="llama3_8b", help="a model group of conf/model (its shape)")
    p.add_argument("--num-layers", type=int, default=0, help="override the shape's depth")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=0, help="0: micro-batch x dp (one micro-batch a step)")
    p.add_argument("--layout", default="dp2", help="tp<N>, dp<N> or tp<N>dp<M> (FSDP2 over dp)")
    p.add_argument("--ac", default="selective", choices=["none", "selective", "full"])
    p.add_argument("--compile", action="store_true", help="compile each block (not the loss)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "mixed", "fp32"])
    p.add_argument(
        "--sdpa",
        default="plain",
        choices=["plain", "titan"],
        help="plain: the backend plain SDPA picks (as the harness); titan: torchtitan's priority, cuDNN, flash, math",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the median")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="CSV to append one row to")
    return p.parse_args(argv)


def degrees(layout: str) -> tuple[int, int]:
    m = re.fullmatch(r"(?:tp(\d+))?(?:dp(\d+))?", layout)
    if not m or not layout:
        raise SystemExit(f"--layout {layout!r}: use tp<N>, dp<N> or tp<N>dp<M>")
    return int(m.group(1) or 1), int(m.group(2) or 1)


def titan_flags(a: argparse.Namespace) -> list[str]:
    """torchtitan's own command-line flags for the case."""
    tp, dp = degrees(a.layout)
    flags = [
        "--model.name",
        "sweepbench_llama3",
        "--model.flavor",
        "case",
        "--training.seq_len",
        str(a.seq_len),
        "--training.local_batch_size",
        str(a.micro_batch),
        "--training.global_batch_size",
        str(a.global_batch or a.micro_batch * dp),
        "--training.steps",
        str(a.steps),
        "--training.dtype",
        "bfloat16" if a.precision == "bf16" else "float32",
        "--training.mixed_precision_param",
        "float32" if a.precision == "fp32" else "bfloat16",
        "--parallelism.tensor_parallel_degree",
        str(tp),
        "--parallelism.data_parallel_shard_degree",
        str(dp),
        "--parallelism.disable_loss_parallel",
        "--activation_checkpoint.mode",
        a.ac,
        "--activation_checkpoint.selective_ac_option",
        "op",
        "--activation_checkpoint.no-preserve-rng-state",
        "--compile.components",
        "model",
        "--metrics.log_freq",
        "1",
        "--metrics.disable_color_printing",
        "--job.dump_folder",
        os.environ.get("TITAN_DUMP", "/tmp/torchtitan_twin"),
    ]
    return flags + (["--compile.enable"] if a.compile else [])


def register_case(a: argparse.Namespace) -> None:
    """torchtitan's llama3 TrainSpec with the case's shape as flavour ``case`` and the synthetic stream."""
    import dataclasses

    import yaml
    from torch.utils.data import IterableDataset
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper
    from torchtitan.models.llama3 import get_train_spec
    from torchtitan.protocols.train_spec import register_train_spec

    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.data import SyntheticTask
    from sweepbench.train.titan_peer import model_args, plain_sdpa

    shape = ModelShape.from_config(yaml.safe_load((ROOT / "conf" / "model" / f"{a.model}.yaml").read_text()))
    shape = shape.with_layers(a.num_layers or None)
    if a.sdpa == "plain":
        ScaledDotProductAttentionWrapper.forward = plain_sdpa  # type: ignore[method-assign]
    _, dp = degrees(a.layout)
    global_batch = a.global_batch or a.micro_batch * dp

    class Synthetic(IterableDataset):
        def __init__(self, dp_rank: int) -> None:
            self.task = SyntheticTask(
                vocab_size=shape.vocab_size, seq_len=a.seq_len, global_batch=global_batch, seed=a.seed
            )
            self.rows = range(dp_rank * global_batch // dp, (dp_rank + 1) * global_batch // dp)

        def __iter__(self):
            step = 0
            while True:
                x, y = self.task.batch(step)
                for r in self.rows:
                    yield {"input": x[r]}, y[r]
                step += 1

    def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: object, job_config: object, **_: object):
        return ParallelAwareDataloader(
            Synthetic(dp_rank), dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=a.micro_batch
        )

    spec = dataclasses.replace(
        get_train_spec(),
        model_args={"case": model_args(shape, a.seq_len)},
        build_tokenizer_fn=None,
        build_dataloader_fn=build_dataloader,
        build_validator_fn=None,
    )
    register_train_spec("sweepbench_llama3", spec)


def rank_main(a: argparse.Namespace) -> None:
    """One torchrun rank: torchtitan's train.py main, with the case registered first."""
    sys.path.insert(0, str(ROOT))
    # torchtitan's ConfigManager.parse_args reads sys.argv as it was when torchtitan.config was first
    # imported (its default argument): its flags take this process's argv before any torchtitan import
    sys.argv = [sys.argv[0], *titan_flags(a)]
    from torchtitan.train import Trainer, main

    register_case(a)
    main(Trainer)


def launch(a: argparse.Namespace, argv: list[str]) -> None:
    tp, dp = degrees(a.layout)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={tp * dp}",
        "--local-ranks-filter=0",
        str(Path(__file__).resolve()),
        *argv,
    ]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    rows = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if m := LOG.search(line):
            rows.append(
                (int(m[1]), float(m[2]), float(m[3].replace(",", "")), float(m[4].replace(",", "")), float(m[5]))
            )
    if proc.wait() != 0:
        raise SystemExit(f"torchtitan's trainer exited {proc.returncode}")
    timed = [r for r in rows if r[0] > a.warmup]
    if not timed:
        raise SystemExit(f"no step after --warmup {a.warmup} in torchtitan's log ({len(rows)} steps logged)")
    tps = statistics.median(r[2] for r in timed)
    last = timed[-1]
    print(
        f"torchtitan {a.model} {a.layout} seq {a.seq_len}: {tps:,.0f} tokens/s per GPU (median of {len(timed)} "
        f"steps; last step {last[3]:.1f} TFLOP/s, MFU {last[4]:.1f}%, {last[1]:.1f} GiB)"
    )
    if a.out:
        new = not Path(a.out).exists()
        with open(a.out, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerow(
                {
                    "model": a.model,
                    "layout": a.layout,
                    "seq_len": a.seq_len,
                    "micro_batch": a.micro_batch,
                    "global_batch": a.global_batch or a.micro_batch * dp,
                    "ac": a.ac,
                    "compile": a.compile,
                    "precision": a.precision,
                    "sdpa": a.sdpa,
                    "steps": a.steps,
                    "warmup": a.warmup,
                    "tokens_per_s_per_gpu": tps,
                    "tps_per_step": " ".join(f"{r[2]:.0f}" for r in rows),
                    "tflops": last[3],
                    "mfu_pct": last[4],
                    "memory_gib": last[1],
                }
            )


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    if "LOCAL_RANK" in os.environ:
        rank_main(args)
    else:
        launch(args, sys.argv[1:])
