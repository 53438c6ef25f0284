"""The train engine's one config, typed, knowing nothing of Hydra.

``TrainKnobs`` are the train benchmark's own knobs: each one's type, default and meaning are
written here once (the benchmark's Hydra schema extends this dataclass and every benchmark's
fields, warm-up and timed steps; ``conf/benchmark/train.yaml`` sets only what it must). ``TrainJob``
is what one job runs: those knobs, its step counts, the model's shape and the layout's degrees,
built once from the Hydra config by the train benchmark and read as attributes everywhere in the
engine."""

from __future__ import annotations

from dataclasses import dataclass

from sweepbench.parallel.specs import ModelShape


@dataclass
class TrainKnobs:
    seq_len: int = 2048  # tokens per sequence (train.yaml: the model's, ${model.seq_len})
    micro_batch: int = 1  # sequences per forward on each dp rank
    # sequences per optimizer step (grad accumulation derived); 0 = micro_batch * dp (* pp with a pipeline)
    global_batch: int = 0
    ac: str = "none"  # activation checkpointing: none | selective | full
    compile: bool = False  # torch.compile each block
    fused_adamw: bool = True
    lr: float = 1e-3
    # fp32 | bf16 (bf16 weights) | mixed (fp32 master weights + bf16 autocast) | fp8 | auto (model.dtype)
    precision: str = "auto"
    # precision=fp8 (torchao float8 linears, bf16 weights, GPU SM89+): torchao's scaling, tensorwise | rowwise
    fp8_recipe: str = "tensorwise"
    # tp > 1: sequence parallel (norms on sequence shards, Shard(1) between blocks); false: plain TP,
    # activations replicated
    tp_sp: bool = True
    # tp > 1 with tp_sp and compile, CUDA only: inductor overlaps TP's collectives with the matmuls
    # (symmetric memory)
    async_tp: bool = False
    # how dp (and cp) ranks hold the weights: fsdp (FSDP2: bf16 params, fp32 reduce) | ddp (dp/cp layouts only)
    dp_shard: str = "fsdp"
    # gpipe | 1f1b | interleaved_1f1b (2 stages/rank) | interleaved_zb | zbv (zero bubble, no compile);
    # train/pipeline.py
    pp_schedule: str = "1f1b"
    cp_impl: str = "ring"  # the attention engine's context-parallel kernel
    lora_rank: int = 0  # 0 = full fine-tune; r > 0 = LoRA adapters on wq/wk/wv/wo, base frozen
    lora_alpha: float = 16.0
    # adapters learn at lr * this * min(1, 512 / hidden size) (train/run.py: lora_lr)
    lora_lr_scale: float = 10.0
    seed: int = 0
    verify_steps: int = 2  # first steps whose loss must match the single-device reference
    # timed steps per sample: 1 = each step timed alone, from an idle device; k > 1 = k steps back to back
    # between one pair of events, reported per step (a training loop's pace: the host queues a step's
    # launches while the device runs the step before)
    steps_per_sample: int = 1
    verify_layers: int = 0  # 0 = full depth where the reference fits one device, else 2 layers
    # torch.profiler window (after the timed steps) + TensorBoard scalars in the job dir
    profile: bool = False
    profile_skip: int = 1
    profile_warmup: int = 1
    profile_active: int = 2
    memory_snapshot: bool = False  # CUDA allocator history of the profiled window (profile=true, GPU only)
    # who trains: ours | hf (transformers LlamaForCausalLM + peft LoRA; single device and dp layouts;
    # train/impls.py)
    impl: str = "ours"
    # none | nf4 (frozen base linears in 4-bit NF4 via bitsandbytes; needs lora_rank > 0, ddp for dp)
    quant: str = "none"
    # none | liger (liger-kernel SwiGLU, RoPE, fused linear cross-entropy; the residual add + RMSNorm as
    # the engine's own Triton kernels; CUDA only)
    fused: str = "none"
    # true: variable-length documents packed per row, attention within documents; tokens/s of real tokens
    padding_free: bool = False
    # true: padding_free's variable-length documents; padding_free=false puts them one per row, padded
    # (its baseline; real tokens/s)
    documents: bool = False


@dataclass(frozen=True)
class TrainJob:
    """What one train job runs: the knobs, the model and the layout (the parallelism group)."""

    knobs: TrainKnobs
    warmup: int  # untimed steps after verification
    iters: int  # timed steps
    model: ModelShape  # the model group, read and checked as every engine reads it
    layout: str  # the parallelism option's name, e.g. tp2pp2
    tp: int  # tensor parallel degree
    pp: int  # pipeline stages
    dp: int  # data parallel degree
    cp: int  # context parallel degree (sequence split)
    ep: int  # expert parallel degree (refused above 1: dense models only)
