"""Parameter specs of a Llama-style transformer (dense or MoE) built from a model config."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# dtype name -> bytes per element (plans and validation need no torch; torch_dtype() does)
DTYPES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def dtype_name(dtype: "str | torch.dtype") -> str:
    """Canonical dtype name ("float32" | "bfloat16" | "float16")."""
    if not isinstance(dtype, str):  # a torch.dtype: its name is str(dtype) without "torch."
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype}; valid: {', '.join(DTYPES)}")
        return name
    name = _ALIASES.get(dtype, dtype)
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    return name


def torch_dtype(dtype: "str | torch.dtype") -> "torch.dtype":
    import torch

    return getattr(torch, dtype_name(dtype))


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: full shape, dtype, sharding ``rule`` (see rules.py) and pipeline
    placement: ``stage`` is "first" (embedding), "last" (final norm, lm head) or
    "layer" (then ``layer`` is the layer index)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    rule: str = "replicated"
    stage: str = "layer"
    layer: int | None = None
    meta: tuple[tuple[str, int], ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def meta_value(self, key: str) -> int:
        return dict(self.meta)[key]


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


@dataclass(frozen=True)
class ModelShape:
    """The model-shape fields of a config, validated."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    num_experts: int = 0
    moe_top_k: int = 0
    seq_len: int = 0

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"model {field}={getattr(self, field)} must be >= 1")
        if self.num_experts < 0:
            raise ValueError(f"model num_experts={self.num_experts} must be >= 0 (0 = dense)")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @classmethod
    def from_config(cls, cfg: Any) -> ModelShape:
        """From an OmegaConf DictConfig, a mapping or any object with attributes."""
        if isinstance(cfg, ModelShape):
            return cfg
        heads = int(_get(cfg, "num_heads"))
        return cls(
            name=str(_get(cfg, "name", "model")),
            num_layers=int(_get(cfg, "num_layers")),
            hidden_size=int(_get(cfg, "hidden_size")),
            num_heads=heads,
            num_kv_heads=int(_get(cfg, "num_kv_heads", heads)),
            ffn_hidden_size=int(_get(cfg, "ffn_hidden_size")),
            vocab_size=int(_get(cfg, "vocab_size")),
            dtype=str(_get(cfg, "dtype", "bfloat16")),
            num_experts=int(_get(cfg, "num_experts", 0)),
            moe_top_k=int(_get(cfg, "moe_top_k", 0)),
            seq_len=int(_get(cfg, "seq_len", 0)),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def with_layers(self, num_layers: int | None) -> ModelShape:
        """The same widths at another depth (None: this one), as a reduced-depth check builds it."""
        return self if not num_layers else replace(self, num_layers=num_layers)

    # Parameter counts of the Llama-3-style decoder the train engine builds from this shape (plain
    # Python: the driver's memory estimate and validation use them before any rank starts).
    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def attention_params(self) -> int:
        """wq, wk, wv, wo (no biases)."""
        d = self.hidden_size
        return d * d + 2 * d * self.kv_dim + d * d

    def lora_params(self, rank: int) -> int:
        """LoRA adapters (A: rank x in, B: out x rank) on wq, wk, wv, wo of one layer."""
        if rank == 0:
            return 0
        d = self.hidden_size
        return rank * (d + d) + rank * (d + self.kv_dim) * 2 + rank * (d + d)

    def layer_params(self) -> int:
        """One block: attention, SwiGLU (w1, w2, w3) and two RMSNorm weights."""
        d = self.hidden_size
        return self.attention_params() + 3 * d * self.ffn_hidden_size + 2 * d

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self, *, lora_rank: int = 0) -> int:
        """All parameters: embedding, blocks, final norm, output projection (untied), adapters."""
        d = self.hidden_size
        return (
            self.embedding_params()
            + self.num_layers * (self.layer_params() + self.lora_params(lora_rank))
            + d
            + self.vocab_size * d
        )


def model_param_specs(cfg: Any) -> tuple[ParamSpec, ...]:
    """All parameters of the model, in a fixed order (embedding, layers, final norm, lm head)."""
    m = ModelShape.from_config(cfg)
    h, f, dt, d = m.hidden_size, m.ffn_hidden_size, m.dtype, m.head_dim
    qkv_meta = (("num_heads", m.num_heads), ("num_kv_heads", m.num_kv_heads), ("head_dim", d))
    specs = [ParamSpec("embedding", (m.vocab_size, h), dt, "vocab", "first")]
    for i in range(m.num_layers):
        p = f"layers.{i}."

        def layer(name: str, shape: tuple[int, ...], rule: str, meta: tuple[tuple[str, int], ...] = ()) -> ParamSpec:
            return ParamSpec(p + name, shape, dt, rule, "layer", i, meta)  # noqa: B023 (called at once)

        specs += [
            layer("input_norm", (h,), "replicated"),
            layer("qkv", ((m.num_heads + 2 * m.num_kv_heads) * d, h), "qkv", qkv_meta),
            layer("o_proj", (h, m.num_heads * d), "row"),
            layer("post_norm", (h,), "replicated"),
        ]
        if m.is_moe:
            e = m.num_experts
            specs += [
                layer("moe.router", (e, h), "replicated"),
                layer("moe.experts_gate_up", (e, 2 * f, h), "experts_gate_up"),
                layer("moe.experts_down", (e, h, f), "experts_down"),
            ]
        else:
            specs += [
                layer("mlp.gate_up", (2 * f, h), "gate_up"),
                layer("mlp.down", (h, f), "row"),
            ]
    specs += [
        ParamSpec("final_norm", (h,), dt, "replicated", "last"),
        ParamSpec("lm_head", (m.vocab_size, h), dt, "vocab", "last"),
    ]
    return tuple(specs)


def total_bytes(specs: tuple[ParamSpec, ...]) -> int:
    return sum(s.nbytes for s in specs)
