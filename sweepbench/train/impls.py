"""Train implementations: ours and peers behind one interface, so one sweep times and verifies
them the same way (``benchmark.impl=ours,hf,torchtitan``).

An implementation is a class built as ``cls(shape, plan, opts, *, device, mesh, positions,
attn_fn)`` with ``step(inputs, targets) -> loss``, ``holds_loss``, ``num_trainable`` and ``parts``
(the modules this rank trains, whose gradients verification reads after the first step), registered
under a name. Importable without torch: names are declared with the module that registers them;
an optional peer names the modules it needs and the install command, and the layouts and recipe
knobs it runs, so a missing extra or a combination it lacks is refused on the driver (one line,
exit 2) before any rank starts."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from sweepbench.core import Registry

IMPLS: Registry[type] = Registry("train implementation")
IMPLS.declare("ours", "sweepbench.train.trainer")
IMPLS.declare("hf", "sweepbench.train.hf_peer")
IMPLS.declare("torchtitan", "sweepbench.train.titan_peer")
IMPLS.declare("fms_peft", "sweepbench.train.fms_peer")
IMPLS.declare("fms_foak", "sweepbench.train.fms_peer")


@dataclass(frozen=True)
class PeerSpec:
    """What an optional implementation needs and runs."""

    modules: tuple[str, ...]  # imported by its module
    install: str  # the command that installs them
    layouts: str  # what it runs, for the refusal line
    axes: tuple[str, ...] = ()  # the model-parallel axes it takes beyond dp ("tp", "pp"; cp: none does)
    knobs: tuple[str, ...] = ()  # recipe knobs it takes set away from their default (recipe.DEFAULTS)
    ac: tuple[str, ...] = ("none", "full")  # activation checkpointing modes it has
    ac_note: str = ""  # how it checkpoints, for the refusal line
    precisions: tuple[str, ...] = ("fp32", "bf16", "mixed")
    dp_shards: tuple[str, ...] = ("fsdp", "ddp")  # how its dp ranks may hold the weights
    packed_attention: str = ""  # how its attention keeps packed documents apart (padding_free)
    requires: tuple[tuple[str, object, str], ...] = ()  # (knob, value it must have, why)
    devices: tuple[str, ...] = ("cpu", "cuda")  # device types it runs on
    device_note: str = ""  # why not on the others, for the refusal line
    # why it must run in a process of its own (a peer that patches library modules for the life of
    # the process), or "" where its rank may be kept for the sweep's next job
    own_process: str = ""


PEERS: dict[str, PeerSpec] = {
    "hf": PeerSpec(
        modules=("transformers", "peft"),
        install='pip install "sweepbench[fms]"',
        layouts="single device and dp layouts (FSDP2 or DDP)",
        knobs=("padding_free", "documents", "lora_rank"),
        ac_note="HF gradient checkpointing is per decoder layer",
        packed_attention="transformers_position_ids",
    ),
    "torchtitan": PeerSpec(
        modules=("torchtitan", "tyro", "torchdata", "datasets"),
        install='pip install "sweepbench[titan]"',
        layouts="single device, dp (FSDP2), tp (sequence parallel), pp and their products",
        axes=("tp", "pp"),
        knobs=("async_tp",),
        ac=("none", "selective", "full"),
        dp_shards=("fsdp",),
    ),
}
# fms-acceleration 0.6 pins numpy<2 (pip would downgrade numpy under torch) yet runs on numpy 2: its
# framework goes in without its dependencies, which the fms extra installs
FMS_INSTALL = 'pip install "sweepbench[fms]" && pip install --no-deps fms-acceleration'
# fms-acceleration's plugins (the seed benchmark's own) on the hf peer's model, single device, bf16
FMS_PEFT = PeerSpec(
    modules=("fms_acceleration", "fms_acceleration_peft", "transformers", "peft", "bitsandbytes"),
    install=FMS_INSTALL,
    layouts="a single device",
    knobs=("quant", "lora_rank"),
    ac_note="HF gradient checkpointing is per decoder layer",
    precisions=("bf16",),
    dp_shards=(),
    requires=(("quant", "nf4", "its plugin loads the base in 4-bit through bitsandbytes"),),
)
PEERS["fms_peft"] = FMS_PEFT
PEERS["fms_foak"] = PeerSpec(
    modules=(*FMS_PEFT.modules, "fms_acceleration_foak"),
    install=FMS_INSTALL,
    layouts="a single device",
    knobs=("quant", "lora_rank"),
    ac_note=FMS_PEFT.ac_note,
    precisions=("bf16",),
    dp_shards=(),
    devices=("cuda",),
    device_note="its fused kernels are Triton kernels for CUDA",
    own_process="its plugin patches transformers' llama module (RoPE, the loss) for the life of the process",
)


def missing(impl: str) -> str | None:
    """Why ``impl`` cannot run in this interpreter (one line), or None when it can."""
    spec = PEERS.get(impl)
    if spec is None:
        return None
    for module in spec.modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            return f"benchmark.impl={impl} needs {module}, which is not installed; install it with: {spec.install}"
    return None


def check_impl(
    impl: str, *, tp: int, pp: int, cp: int, dp: int, dp_shard: str, ac: str, precision: str, knobs: dict[str, object]
) -> None:
    """ValueError (one line) for an unknown implementation, a missing extra, a layout it does not
    run, an activation checkpointing mode or precision (resolved) it lacks, a way of holding the
    weights on dp ranks it lacks, or a recipe knob (``knobs``: name -> value, those set away from
    their default) it lacks."""
    IMPLS.check(impl, key="benchmark.impl")
    spec = PEERS.get(impl)
    if spec is None:
        return
    if any(degree > 1 and axis not in spec.axes for axis, degree in (("tp", tp), ("pp", pp), ("cp", cp))):
        raise ValueError(
            f"benchmark.impl={impl} with parallelism tp={tp} pp={pp} cp={cp}: it runs {spec.layouts}; "
            f"use one of those or impl=ours"
        )
    if ac not in spec.ac:
        note = f" ({spec.ac_note})" if spec.ac_note else ""
        raise ValueError(
            f"benchmark.ac={ac} with benchmark.impl={impl}: it checkpoints activations as "
            f"{' or '.join(spec.ac)}{note}; use one of those"
        )
    if dp > 1 and not spec.dp_shards:
        raise ValueError(
            f"benchmark.impl={impl} with parallelism dp={dp}: it runs {spec.layouts}; use dp=1 or impl=ours"
        )
    if dp > 1 and dp_shard not in spec.dp_shards:
        raise ValueError(
            f"benchmark.dp_shard={dp_shard} with benchmark.impl={impl}: its dp ranks hold the weights "
            f"as {' or '.join(spec.dp_shards)}; use that or impl=ours"
        )
    if precision not in spec.precisions:
        raise ValueError(
            f"benchmark.precision={precision} with benchmark.impl={impl}: it trains in "
            f"{', '.join(spec.precisions)}; use {'one of those' if len(spec.precisions) > 1 else 'that'} or impl=ours"
        )
    for knob, value in knobs.items():
        if knob not in spec.knobs:
            raise ValueError(
                f"benchmark.{knob}={value} with benchmark.impl={impl}: the {impl} implementation "
                f"runs the shared recipe without it; use impl=ours or leave {knob} at its default"
            )
    for knob, value, reason in spec.requires:
        if knobs.get(knob) != value:
            got = knobs[knob] if knob in knobs else "its default"
            raise ValueError(
                f"benchmark.impl={impl} needs benchmark.{knob}={value} (got {got}): {reason}; "
                f"set it, or use impl=hf or ours"
            )
    why = missing(impl)
    if why:
        raise ValueError(why)
