"""Parameter and FLOP counts of the Llama-3-style decoder, in plain Python (no torch).

The driver uses these before any rank starts (memory estimate, validation), the job uses them for
MFU, and a test checks them against a hand count. The MFU numerator is torchtitan's:

    FLOPs/token = 6 * (N - N_embedding) + 6 * L * H * 2 * d_head * S

(6 = forward 2 + backward 4 per parameter and token; the second term is the attention score and
value matmuls, 2 * d_head * S per head and token, counted for the full S x S square as torchtitan
does, causal mask or not). With LoRA the frozen base weights have no weight gradient, so they
count 4 FLOPs per parameter and token instead of 6; the adapters count 6."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweepbench.parallel.specs import ModelShape


@dataclass(frozen=True)
class Shape:
    """The widths of a decoder, from the ``model`` config group."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, model: Any, *, num_layers: int | None = None) -> "Shape":
        """From a ``model`` config, read and checked as every engine reads it (``ModelShape``)."""
        m = ModelShape.from_config(model)
        return cls(
            num_layers or m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

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


def flops_per_token(shape: Shape, seq_len: int, *, lora_rank: int = 0) -> float:
    """Training FLOPs per token (torchtitan's formula; see the module docstring)."""
    n = shape.num_params(lora_rank=lora_rank) - shape.embedding_params()
    adapters = shape.num_layers * shape.lora_params(lora_rank)
    dense = 4 * (n - adapters) + 6 * adapters if lora_rank else 6 * n
    attention = 6 * shape.num_layers * shape.num_heads * 2 * shape.head_dim * seq_len
    return float(dense + attention)


def bytes_per_param(precision: str, *, trainable: bool) -> int:
    """Weights + gradient + AdamW's two moments, in the precision's storage dtypes."""
    if precision in ("bf16", "fp8"):  # fp8 keeps bf16 weights and states (float8 only inside the matmuls)
        return 2 + (2 + 2 + 2 if trainable else 0)
    return 4 + (4 + 4 + 4 if trainable else 0)  # fp32 and mixed keep fp32 weights and states
