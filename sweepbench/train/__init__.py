"""The training engine: a Llama-3-style decoder on plain torch and its parallel layouts.

    config.py           the engine's one config: the benchmark's knobs, the model and the layout
    shape.py, plan.py   sizes, FLOPs/token and the checks that refuse a config (no torch)
    model.py, init.py   the decoder (RMSNorm, RoPE, GQA via SDPA, SwiGLU, LoRA) and its
                        name-seeded weights, identical in every layout
    parallelize.py      TP + sequence parallel, activation checkpointing, compile, FSDP2 / DDP
    context.py          context parallel through sweepbench.attention
    trainer.py          one rank's model pieces, pipeline schedule, optimizer and step
    data.py, verify.py  the learnable synthetic task; the single-device reference and checks
    flops.py, memory.py the bf16 peak table and measured matmul ceiling; memory two ways
    profile.py          profiler traces, TensorBoard scalars, memory snapshot
    run.py              one job on one rank: verify, time, measure, report

Knows nothing of Hydra sweeps; ``sweepbench/benchmarks/train.py`` is the plugin that drives it.
Importing this package (and config/shape/plan) does not import torch."""
