"""The ``fms_peft`` and ``fms_foak`` train implementations: fms-acceleration's own plugins (the
accelerations the FMS benchmark measures) on the Hugging Face peer's model, applied in the order
fms-hf-tuning applies them, so one sweep times them beside ours and beside the plain HF + peft
baseline (``benchmark.impl=ours,hf,fms_peft,fms_foak``).

- ``fms_peft``: fms-acceleration-peft's bitsandbytes plugin, as its sample configuration
  ``accelerated-peft-bnb-nf4`` sets it: the base loaded in 4-bit NF4 with double-quantized scales
  (bf16 compute), prepared for k-bit training without upcasting, peft's LoRA installed by the
  plugin (its adapters in fp32, as peft keeps them), the forward under bf16 autocast as
  transformers' Trainer runs it with ``bf16=True``.
- ``fms_foak``: the same plus fms-acceleration-foak's fused ops and kernels
  (``accelerated-peft-bnb-nf4-foak``: fast cross-entropy, RMSNorm and RoPE; its fused LoRA over
  the 4-bit base is off, see FOAK_BNB); on a bf16 base (``quant=none``) its ``foak-fast-kernels``
  configuration (the same three) on a full fine-tune or on peft's LoRA (fp32 adapters, as SFTTrainer
  installs them).

The sequence, per job: the framework from the plugin configuration; the model from the framework's
loader where a plugin loads it (our initial weights, mapped to HF's names, written as a checkpoint
to a temporary folder and loaded back through the plugin's ``from_pretrained`` with its
``BitsAndBytesConfig``), else the HF peer's model holding our weights; ``augmentation`` (the
bitsandbytes plugin installs LoRA; foak registers its patch rules); peft's LoRA where no plugin
installed it; ``get_callbacks_and_ready_for_train`` (the patches applied); then our LoRA's initial
adapters copied in, so the first steps are verified against our single-device reference (for a
4-bit base: the same weights rounded through NF4 and kept dense). The loss is the model's own
(``labels``), with HF's convention: a row of S tokens trains S-1 predictions (the last position
has no label), within the bf16 tolerance of our reference's mean over S. The training arguments
the plugins read (bf16, gradient checkpointing) are given as those attributes alone: the
framework reads nothing else of them, and building transformers' TrainingArguments would set up
accelerate's process state beside ours.

fms-acceleration keeps its activated plugins and foak's patch rules in process-wide registries;
each build starts a framework of its own and clears the patch registry, and foak's patches of
transformers' llama module last for the process (``own_process`` in ``impls.PEERS``: such a job
never keeps its rank for the sweep's next job)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from sweepbench.parallel.specs import ModelShape
from sweepbench.train.hf_peer import HFTrainer, hf_model, load_ours, lora_config
from sweepbench.train.impls import IMPLS, missing
from sweepbench.train.plan import TrainPlan

try:
    import bitsandbytes as bnb
    import yaml
    from fms_acceleration import AccelerationFramework
    from fms_acceleration.model_patcher import ModelPatcher
    from peft import get_peft_model
except ImportError as e:  # the plugins are not installed: one line naming the install command
    raise ImportError(missing("fms_peft") or f"benchmark.impl=fms_peft cannot import fms-acceleration: {e}") from None

IGNORE = -100  # transformers' label of a position that trains nothing

# fms-acceleration's sample configurations (their plugin sections), by the sample's name
BNB_NF4 = {"bitsandbytes": {"quant_type": "nf4", "no_peft_model": False}}
# fused_lora off: fms-acceleration-foak 0.7.4's fused LoRA dequantizes the 4-bit base by calling
# bitsandbytes' C functions with the arguments of bitsandbytes before 0.43 (no stream); with 0.50.2 it
# fails at the first forward ("this function takes at least 7 arguments (6 given)", one H200), and
# fms-acceleration-peft itself needs bitsandbytes >= 0.45.1. The rest of its sample runs.
FOAK_BNB = {
    "base_layer": "bitsandbytes",
    "fused_lora": False,
    "fast_loss": True,
    "fast_rms_layernorm": True,
    "fast_rope_embeddings": True,
}
FOAK_FAST_KERNELS = {"fast_loss": True, "fast_rms_layernorm": True, "fast_rope_embeddings": True}


@IMPLS.register("fms_peft")
class FmsPeftTrainer(HFTrainer):
    """fms-acceleration-peft's bitsandbytes plugin (``accelerated-peft-bnb-nf4``)."""

    @classmethod
    def plugins(cls, quant: str) -> dict[str, Any]:
        """The framework's ``plugins`` section for a base quantized as ``quant``."""
        return {"peft": {"quantization": dict(BNB_NF4)}}

    def build_model(
        self,
        shape: ModelShape,
        plan: TrainPlan,
        opts: Any,
        *,
        device: torch.device,
        dtype: torch.dtype,
        weights: dict[str, torch.Tensor],
    ) -> nn.Module:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the bitsandbytes loader places the model on the current device
        with tempfile.TemporaryDirectory(prefix="sweepbench-fms-") as tmp:
            folder = Path(tmp)
            (folder / "acceleration.yaml").write_text(yaml.safe_dump({"plugins": self.plugins(opts.quant)}))
            framework = _framework(folder / "acceleration.yaml")
            base = {k: v for k, v in weights.items() if ".lora_" not in k}
            loaded: frozenset[str] = frozenset()
            if framework.requires_custom_loading:  # the plugin loads the base: from a checkpoint of ours
                dense = hf_model(shape, plan.seq_len, device=device, dtype=dtype)
                load_ours(dense, base)
                dense.save_pretrained(folder / "model")
                del dense
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                model = framework.model_loader(
                    str(folder / "model"), torch_dtype=dtype, attn_implementation="sdpa", low_cpu_mem_usage=True
                )
                loaded = frozenset(base)
            else:
                model = hf_model(shape, plan.seq_len, device=device, dtype=dtype)
                model.config.architectures = [type(model).__name__]  # as a loaded checkpoint names it
        args = SimpleNamespace(
            bf16=dtype == torch.bfloat16,
            fp16=False,
            gradient_checkpointing=opts.ac == "full",
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
        ModelPatcher.rules.clear()  # a build before this one in the process registered the same rules
        ModelPatcher.history.clear()
        lora = lora_config(opts) if opts.lora_rank else None
        model, (lora,) = framework.augmentation(model, args, modifiable_args=(lora,))
        if lora is not None:  # no plugin installed it: peft as SFTTrainer installs it (fp32 adapters)
            model = get_peft_model(model, lora)
        framework.get_callbacks_and_ready_for_train(model, None)
        load_ours(model, weights, loaded=loaded)  # a base loaded from the checkpoint holds ours already
        # what the job ran, for its record: the plugins' configuration and the patch rules applied
        self.recipe_notes = {
            "fms_plugins": self.plugins(opts.quant),
            "fms_patches": sorted({h.rule_id for h in ModelPatcher.history}),
            "fms_4bit_linears": sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()),
        }
        return model

    def micro_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The model's own loss (its fast loss where a plugin patched it in): labels are the targets
        moved one place right, as transformers shifts them back inside. Under bf16 autocast, as
        transformers' Trainer runs the forward with ``bf16=True`` (which the plugins require): the
        fp32 adapters then compute in bf16, as for their users."""
        labels = torch.cat([torch.full_like(y[:, :1], IGNORE), y[:, :-1]], dim=1)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.model(input_ids=x, labels=labels, use_cache=False).loss


@IMPLS.register("fms_foak")
class FmsFoakTrainer(FmsPeftTrainer):
    """fms-acceleration-foak's fused ops and kernels: over the bitsandbytes plugin's 4-bit base
    (``accelerated-peft-bnb-nf4-foak``), or alone on a bf16 base (``foak-fast-kernels``)."""

    @classmethod
    def plugins(cls, quant: str) -> dict[str, Any]:
        if quant == "nf4":
            return {"peft": {"quantization": {**BNB_NF4, "fused_ops_and_kernels": dict(FOAK_BNB)}}}
        return {"training": {"fused_ops_and_kernels": dict(FOAK_FAST_KERNELS)}}


def _framework(config: Path) -> Any:
    """An AccelerationFramework with plugin lists of its own (the class keeps them process-wide,
    so a second framework in one process would keep the first one's plugins)."""
    framework = AccelerationFramework.__new__(AccelerationFramework)
    framework.active_plugins = []
    framework.plugins_require_custom_loading = []
    framework.__init__(str(config))
    return framework
