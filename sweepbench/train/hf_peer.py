"""The ``hf`` train implementation: Hugging Face transformers' ``LlamaForCausalLM`` (SDPA
attention) with peft's LoRA, the baseline a fine-tuning stack such as fms-hf-tuning starts from,
run on the same recipe as ours so one sweep (``benchmark.impl=ours,hf``) times both.

Same shape (a ``LlamaConfig`` from our model config, random weights, nothing downloaded), same
weights: our engine's name-seeded initialisation is mapped onto HF's names, with wq/wk's rows of
each head reordered from our interleaved RoPE pairs (2i, 2i+1) to HF's rotate-half pairs (i, i+D/2),
so at step 0 both compute the same function and their losses can be checked against our
single-device reference. Same optimizer (AdamW, betas 0.9/0.95, weight decay 0.1, fused), same
micro-batching, precision (bf16 weights, or fp32 master + bf16 autocast), activation checkpointing
(HF gradient checkpointing: full, per decoder layer), compile (each decoder layer), and the same
FSDP2 / DDP over dp ranks."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from sweepbench.train.fused import to_rotate_half
from sweepbench.train.impls import IMPLS, missing
from sweepbench.train.init import init_weights
from sweepbench.train.model import ROPE_THETA, Transformer
from sweepbench.train.plan import TrainPlan
from sweepbench.parallel.specs import ModelShape

try:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # the extra is not installed: one line naming the install command
    raise ImportError(missing("hf") or f"benchmark.impl=hf cannot import transformers/peft: {e}") from None

DTYPES = {"fp32": torch.float32, "mixed": torch.float32, "bf16": torch.bfloat16}
# our projection -> HF's (the decoder layer's submodule path)
PROJECTIONS = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def llama_config(shape: ModelShape, seq_len: int) -> LlamaConfig:
    # attn_implementation is a keyword every PretrainedConfig takes (kept as _attn_implementation);
    # the typed signature of LlamaConfig's dataclass lists only its own fields
    return LlamaConfig(  # type: ignore[call-arg]
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.ffn_hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
        use_cache=False,
    )


def lora_config(opts: Any) -> LoraConfig:
    """peft's LoRA of our recipe: rank and alpha as ours, on q/k/v/o, no dropout, no bias."""
    return LoraConfig(
        r=opts.lora_rank, lora_alpha=opts.lora_alpha, lora_dropout=0.0, bias="none", target_modules=LORA_TARGETS
    )


def hf_model(shape: ModelShape, seq_len: int, *, device: torch.device, dtype: torch.dtype) -> Any:
    """transformers' LlamaForCausalLM of ``shape`` on ``device`` in ``dtype`` (its own random weights)."""
    with torch.device(device):
        model: nn.Module = LlamaForCausalLM(llama_config(shape, seq_len))
    return model.to(dtype)


def our_weights(shape: ModelShape, opts: Any, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our engine's initial weights of this recipe (LoRA's included), under HF's names."""
    with torch.device("meta"):
        ours = Transformer(shape, lora_rank=opts.lora_rank, lora_alpha=opts.lora_alpha)
    init_weights(ours, seed=opts.seed, device=device, dtype=dtype)
    return hf_state(dict(ours.named_parameters()), shape)


def hf_state(ours: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """Our engine's weights under HF's (and peft's) names: ``model.*`` and ``lm_head.weight``,
    LoRA's A and B as ``<proj>.lora_A`` / ``lora_B``."""
    out = {
        "model.embed_tokens.weight": ours["tok_embeddings.weight"],
        "model.norm.weight": ours["norm.weight"],
        "lm_head.weight": ours["output.weight"],
    }
    for name, value in ours.items():
        if not name.startswith("layers."):
            continue
        _, layer, rest = name.split(".", 2)
        prefix = f"model.layers.{layer}."
        if rest == "attention_norm.weight":
            out[prefix + "input_layernorm.weight"] = value
            continue
        if rest == "ffn_norm.weight":
            out[prefix + "post_attention_layernorm.weight"] = value
            continue
        module, leaf = rest.rsplit(".", 1)
        if leaf in ("weight", "lora_b") and module in ("attention.wq", "attention.wk"):
            value = to_rotate_half(value, shape.head_dim)
        key = {"weight": "weight", "lora_a": "lora_A", "lora_b": "lora_B"}[leaf]
        out[f"{prefix}{PROJECTIONS[module]}.{key}"] = value
    return out


def our_name(raw: str) -> str:
    """A (peft-wrapped) HF parameter's name under ``hf_state``'s names."""
    name = raw.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".default.", ".")
    return name.removesuffix(".weight") if ".lora_" in name else name


@torch.no_grad()
def load_ours(model: nn.Module, ours: dict[str, torch.Tensor], *, loaded: frozenset[str] = frozenset()) -> None:
    """Copy our weights into the (peft-wrapped) HF model; every parameter must be covered, those
    named in ``loaded`` (already holding them, e.g. quantized from a checkpoint of them) left as they are."""
    filled = set(loaded)
    for raw, param in model.named_parameters():
        name = our_name(raw)
        if name not in loaded:
            param.copy_(ours[name])
        filled.add(name)
    assert filled == set(ours), f"weights not mapped: {sorted(set(ours) - filled)}"


@IMPLS.register("hf")
class HFTrainer:
    """The same interface as ``trainer.Trainer`` on dp layouts: ``step(inputs, targets) -> loss``."""

    holds_loss = True

    def __init__(
        self,
        shape: ModelShape,
        plan: TrainPlan,
        opts: Any,
        *,
        device: torch.device,
        mesh: DeviceMesh | None = None,
        **_: Any,
    ) -> None:
        assert plan.tp == plan.pp == plan.cp == 1, "the hf implementation runs dp layouts (checked before launch)"
        self.plan, self.device = plan, device
        dtype = DTYPES[plan.precision]
        model = self.build_model(
            shape, plan, opts, device=device, dtype=dtype, weights=our_weights(shape, opts, device, dtype)
        )
        model.train()
        if opts.ac == "full":
            hf: Any = model  # a LlamaForCausalLM, or peft's model, which passes the call on to it
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = _decoder_layers(model)
        if opts.compile:
            for layer in layers:
                layer.compile()
        self.sharded = mesh is not None and plan.dp > 1 and opts.dp_shard == "fsdp"
        if self.sharded and mesh is not None:
            _apply_fsdp(model, layers, mesh["dp"], precision=plan.precision)
        elif mesh is not None and plan.dp > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(
                model,
                process_group=mesh["dp"].get_group(),
                device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=100,
            )
        self.model = model
        self.parts = [model]  # what verification reads the gradient of, as of every implementation
        params = [p for p in model.parameters() if p.requires_grad]
        self.num_trainable = sum(p.numel() for p in params)
        self.optimizer = torch.optim.AdamW(
            params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=opts.fused_adamw
        )

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
        """transformers' model of ``shape`` holding ``weights`` (ours under HF's names), with
        peft's LoRA where ``opts.lora_rank``."""
        model = hf_model(shape, plan.seq_len, device=device, dtype=dtype)
        if opts.lora_rank:
            # adapters in the weights' dtype, as ours (peft would otherwise keep them in fp32)
            model = get_peft_model(model, lora_config(opts), autocast_adapter_dtype=False)
        load_ours(model, weights)
        return model

    def micro_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One micro-batch's mean loss over every position (targets ``y``), as our engine's."""
        logits = self.model(**_model_inputs(x), use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        mb, n = self.plan.micro_batch, self.plan.num_micro
        loss = torch.zeros((), device=self.device)
        for i in range(n):
            x, y = inputs[i * mb : (i + 1) * mb], targets[i * mb : (i + 1) * mb]
            # DDP's no_sync: the gradients are reduced once, after the last micro-batch
            no_sync = cast(
                "Callable[[], contextlib.AbstractContextManager] | None", getattr(self.model, "no_sync", None)
            )
            sync = no_sync() if no_sync is not None and i < n - 1 else contextlib.nullcontext()
            with sync:
                with self.plan.autocast(self.device.type, sharded=self.sharded):
                    part = self.micro_loss(x, y) / n
                part.backward()
            loss += part.detach()
        self.optimizer.step()
        return loss

    def bubble(self) -> dict[str, float | None]:
        return {"analytic": 0.0, "schedule": None}  # no pipeline


def _model_inputs(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token ids, or a packed ``[B, 2, S]`` batch (tokens, positions; see ``packing.py``) as one
    sequence with position ids restarting per document: transformers then masks attention within
    documents (its packed-sequence detection from position ids, with no attention mask)."""
    if x.dim() == 2:
        return {"input_ids": x}
    return {"input_ids": x[:, 0].reshape(1, -1), "position_ids": x[:, 1].reshape(1, -1)}


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]


def _apply_fsdp(model: nn.Module, layers: list[nn.Module], mesh: DeviceMesh, *, precision: str) -> None:
    """FSDP2 as ours: each decoder layer its own unit, then the rest; bf16 compute, fp32 reduce."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_dtype = torch.bfloat16 if precision in ("bf16", "mixed") else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
