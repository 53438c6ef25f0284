"""fms-acceleration's plugins on transformers' own Trainer, without sweepbench's harness: the
standalone twin of ``benchmark.impl=fms_peft`` and ``fms_foak``, run as fms-hf-tuning runs them.

    python bench/peers/fms_train.py --plugin fms_peft --model llama3_1b --quant nf4 --lora-rank 16 \\
        --seq-len 4096 --micro-batch 4 --steps 13 --warmup 3 --out fms_peft.csv

The sequence is fms-hf-tuning's (``tuning/sft_trainer.py``): an AccelerationFramework from the
plugin's sample configuration (the same ones the peer writes: ``accelerated-peft-bnb-nf4``, its foak
variant, ``foak-fast-kernels``); the model from a checkpoint folder, through the framework's
``model_loader`` where a plugin loads it (bitsandbytes NF4) or transformers' ``from_pretrained``;
``augmentation`` with the Trainer's arguments and peft's LoRA config; peft's ``get_peft_model`` where
no plugin installed LoRA (as SFTTrainer does); transformers' ``Trainer`` (fused AdamW, constant
learning rate, its default gradient clipping at norm 1.0, bf16), then the framework's
``get_callbacks_and_ready_for_train(model, trainer.accelerator)`` (the patches applied) and its
callbacks added. The checkpoint is the model group's shape (``conf/model``) with transformers'
random initialisation, written to a temporary folder: nothing is downloaded. The data is the
harness's synthetic token stream (``sweepbench.train.data.SyntheticTask``), each row as ``input_ids``
with ``labels`` the same ids (transformers shifts them). Only the case's shape and data come from
sweepbench; the model, the plugins and the training loop are transformers' and fms-acceleration's.

Timed by a TrainerCallback: each optimizer step from ``on_step_begin`` to ``on_step_end``, the
device synchronised at both (the Trainer's own loop between them: forward, backward, clipping,
optimizer step, zero_grad). ``--profile DIR`` runs 4 more steps after those and keeps the last 3
under torch.profiler (a Chrome trace in DIR, as the harness's ``benchmark.profile=true`` keeps steps
after its timed ones; ``bench/gpu/trace_top.py`` compares the two). Prints the median tokens/s of the steps after --warmup, the first and
last losses the Trainer logged (finite, the mean of the last three below the first: the steps
trained), and the
allocator's peak; --out gets a CSV row. ``--device cpu`` runs it at tiny size (the bitsandbytes plugin
runs NF4 on CPU tensors; foak's kernels need CUDA)."""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILED = 4  # steps after the timed ones with --profile: 1 warm-up of the profiler, 3 kept
COLUMNS = [
    "plugin",
    "model",
    "quant",
    "lora_rank",
    "seq_len",
    "micro_batch",
    "steps",
    "warmup",
    "tokens_per_s",
    "step_median_s",
    "step_min_s",
    "step_max_s",
    "loss_first",
    "loss_last",
    "peak_allocated_gib",
    "linears_4bit",
    "patches",
]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plugin", required=True, help="fms_peft or fms_foak (the peer's benchmark.impl)")
    p.add_argument("--model", default="llama3_1b", help="a model group of conf/model (its shape)")
    p.add_argument("--quant", default="nf4", help="nf4 (the plugin's 4-bit base) or none (fms_foak only)")
    p.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tune (fms_foak on a bf16 base only)")
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=13, help="optimizer steps, warm-up included")
    p.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    p.add_argument("--lr", type=float, default=0.0, help="default: the harness's for the case (train/run.py: lora_lr)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", type=Path, help="append a CSV row here")
    p.add_argument("--profile", type=Path, help="profile 3 steps after the timed ones into this folder")
    a = p.parse_args(argv)
    errors = []
    if a.plugin not in ("fms_peft", "fms_foak"):
        errors.append(f"--plugin {a.plugin!r}: valid: fms_peft, fms_foak")
    if a.quant not in ("nf4", "none"):
        errors.append(f"--quant {a.quant!r}: valid: nf4, none")
    elif a.quant == "none" and a.plugin == "fms_peft":
        errors.append("--quant none with --plugin fms_peft: its plugin loads the base in 4-bit; use --quant nf4")
    if a.quant == "nf4" and a.lora_rank < 1:
        errors.append(f"--lora-rank {a.lora_rank} with --quant nf4: a 4-bit base trains adapters; use a rank >= 1")
    if a.plugin == "fms_foak" and a.device != "cuda":
        errors.append("--plugin fms_foak with --device cpu: foak's kernels are Triton kernels for CUDA")
    if not 0 <= a.warmup < a.steps:
        errors.append(f"--warmup {a.warmup} with --steps {a.steps}: needs 0 <= warmup < steps")
    if not (ROOT / "conf" / "model" / f"{a.model}.yaml").exists():
        errors.append(f"--model {a.model!r}: no conf/model/{a.model}.yaml")
    if errors:
        print(f"fms_train: {errors[0]}", file=sys.stderr)
        raise SystemExit(2)
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    import torch
    import yaml
    from fms_acceleration import AccelerationFramework
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    sys.path.insert(0, str(ROOT))
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.data import SyntheticTask
    from sweepbench.record.atomic import write_atomic
    from sweepbench.train.impls import IMPLS
    from sweepbench.train.config import TrainKnobs
    from sweepbench.train.hf_peer import hf_model, lora_config
    from sweepbench.train.run import lora_lr

    plugins = IMPLS.get(a.plugin).plugins(a.quant)  # the peer's own sample configuration
    shape = ModelShape.from_config(yaml.safe_load((ROOT / "conf" / "model" / f"{a.model}.yaml").read_text()))
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    task = SyntheticTask(vocab_size=shape.vocab_size, seq_len=a.seq_len, global_batch=a.micro_batch, seed=a.seed)
    total = a.steps + (PROFILED if a.profile else 0)  # the timed steps, then the profiled ones
    rows = [x for s in range(total) for x in task.batch(s)[0]]
    dataset = [{"input_ids": x, "labels": x} for x in rows]

    with tempfile.TemporaryDirectory(prefix="fms-twin-") as tmp:
        folder = Path(tmp)
        (folder / "acceleration.yaml").write_text(yaml.safe_dump({"plugins": plugins}))
        framework = AccelerationFramework(str(folder / "acceleration.yaml"))
        checkpoint = hf_model(shape, a.seq_len, device=device, dtype=torch.bfloat16)
        checkpoint.save_pretrained(folder / "model")
        del checkpoint
        if device.type == "cuda":
            torch.cuda.empty_cache()
        load = dict(torch_dtype=torch.bfloat16, attn_implementation="sdpa", low_cpu_mem_usage=True)
        if framework.requires_custom_loading:
            model = framework.model_loader(str(folder / "model"), **load)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(folder / "model"), **load).to(device)
        args = TrainingArguments(
            output_dir=str(folder / "out"),
            per_device_train_batch_size=a.micro_batch,
            max_steps=total,
            learning_rate=a.lr or lora_lr(TrainKnobs(lora_rank=a.lora_rank), shape.hidden_size),
            lr_scheduler_type="constant",
            optim="adamw_torch_fused",
            bf16=True,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=device.type == "cpu",
            dataloader_num_workers=0,
            seed=a.seed,
        )
        lora = lora_config(a) if a.lora_rank else None
        model, (lora,) = framework.augmentation(model, args, modifiable_args=(lora,))
        if lora is not None:
            model = get_peft_model(model, lora)
        times: list[float] = []

        class StepTimes(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, *_: object, **__: object) -> None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()

            def on_step_end(self, *_: object, **__: object) -> None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - self.t0)

        class Profile(TrainerCallback):  # type: ignore[misc]
            """torch.profiler over the steps after the timed ones: 1 warm-up, then the rest active."""

            prof: object = None

            def on_step_begin(self, _: object, state: object, *__: object, **___: object) -> None:
                if a.profile and self.prof is None and getattr(state, "global_step") == a.steps:
                    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

                    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                    self.prof = profile(
                        activities=acts,
                        schedule=schedule(wait=0, warmup=1, active=PROFILED - 1, repeat=1),
                        on_trace_ready=tensorboard_trace_handler(str(a.profile), worker_name="twin", use_gzip=True),
                    )
                    self.prof.__enter__()
                if self.prof is not None:  # the step as the timer sees it, for trace_top's --step-name
                    self.mark = torch.profiler.record_function("trainer_step")
                    self.mark.__enter__()

            def on_step_end(self, *_: object, **__: object) -> None:
                if self.prof is not None:
                    self.mark.__exit__(None, None, None)
                    self.prof.step()

            def on_train_end(self, *_: object, **__: object) -> None:
                if self.prof is not None:
                    self.prof.__exit__(None, None, None)

        trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[StepTimes(), Profile()])
        for callback in framework.get_callbacks_and_ready_for_train(model, trainer.accelerator):
            trainer.add_callback(callback)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        import bitsandbytes as bnb

        linears_4bit = sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())

    from fms_acceleration.model_patcher import ModelPatcher

    timed = times[a.warmup : a.steps]
    median = statistics.median(timed)
    tokens = a.micro_batch * a.seq_len
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    tail = losses[-3:]
    if not (losses and all(math.isfinite(x) for x in losses) and sum(tail) / len(tail) < losses[0]):
        print(f"fms_train: the steps did not train: losses {losses}", file=sys.stderr)
        return 1
    row = {
        "plugin": a.plugin,
        "model": a.model,
        "quant": a.quant,
        "lora_rank": a.lora_rank,
        "seq_len": a.seq_len,
        "micro_batch": a.micro_batch,
        "steps": a.steps,
        "warmup": a.warmup,
        "tokens_per_s": tokens / median,
        "step_median_s": median,
        "step_min_s": min(timed),
        "step_max_s": max(timed),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "peak_allocated_gib": peak,
        "linears_4bit": linears_4bit,
        "patches": " ".join(sorted({h.rule_id for h in ModelPatcher.history})),
    }
    print(
        f"fms_train {a.plugin} {a.model} quant={a.quant} lora={a.lora_rank} seq {a.seq_len} mb {a.micro_batch}: "
        f"{row['tokens_per_s']:,.0f} tokens/s (median of {len(timed)} steps, {median * 1e3:.1f} ms), loss "
        f"{losses[0]:.4f} -> {losses[-1]:.4f}, peak allocated {peak:.2f} GiB, {linears_4bit} 4-bit linears, patches: {row['patches'] or 'none'}"
    )
    if a.out:
        import io

        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=COLUMNS)
        if not a.out.exists():
            w.writeheader()
        w.writerow(row)
        write_atomic(a.out, (a.out.read_text() if a.out.exists() else "") + text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
