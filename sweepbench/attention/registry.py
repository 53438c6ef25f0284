"""The context-parallel implementations, by name, with what each can run (torch-free, so that a
sweep's jobs are checked before any rank starts). Each entry points at its code ("module:attr"),
imported only where a rank runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sweepbench.core import Registry, load_entry

DEVICES = ("cpu", "cuda")
PATTERNS = ("dense", "dilated")
# the SDPA backends (sweepbench.attention.ops) and the device each runs on
SDPA_DEVICE = {"cpu_flash": "cpu", "cudnn": "cuda", "flash": "cuda", "efficient": "cuda"}
# chunks of the sequence each rank holds, by placement (sweepbench.attention.placement)
PLACEMENT_CHUNKS = {"contiguous": 1, "zigzag": 2, "usp": 2}


def usp_degree(world_size: int) -> int:
    """The Ulysses degree of ``usp`` on W ranks: the largest divisor of W below W (W=4: 2 x a ring
    of 2; W=8: 4 x 2), so that a ring of at least 2 remains; 1 (a plain ring) for W <= 3."""
    return max((d for d in range(1, world_size) if world_size % d == 0), default=1)


def _whole(world_size: int) -> int:
    return world_size


@dataclass(frozen=True)
class ImplSpec:
    name: str
    placement: str  # how the caller must lay out tokens: zigzag | contiguous
    entry: str  # "module:function" (q, k, v, *, comm, causal, scale, backend, pattern, branches, seq_len)
    summary: str
    device_types: tuple[str, ...] = DEVICES
    patterns: tuple[str, ...] = PATTERNS
    causal_only: bool = False
    heads_divisor: Callable[[int], int] | None = None  # W -> what heads must divide by (all-to-all over heads)
    context: str = ""  # "module:function": a context that must cover forward and backward
    own_comm: bool = True  # communicates through sweepbench's Comm (so LocalComm times it without communication)
    captures: bool = True  # its fwd and bwd can be captured as CUDA graphs (benchmark.cuda_graph)
    dilated_placement: str = ""  # the layout for pattern=dilated where it differs from ``placement``
    # on one rank (W=1), dense: one call of the SDPA kernel over the whole sequence, the call T1 times
    # (so the runner takes that job's fwd+bwd from T1 rather than timing it again)
    one_rank_is_t1: bool = False

    def placement_for(self, pattern: str) -> str:
        """How the caller must lay out tokens for ``pattern``."""
        return self.dilated_placement if pattern == "dilated" and self.dilated_placement else self.placement

    def load(self) -> Callable[..., Any]:
        return load_entry(self.entry)

    def load_context(self) -> Callable[..., Any] | None:
        return load_entry(self.context) if self.context else None


IMPLS: Registry[ImplSpec] = Registry("attention impl", ordered=True)


def register_impl(spec: ImplSpec) -> ImplSpec:
    return IMPLS.add(spec.name, spec)


_E = "sweepbench.attention.impls"
register_impl(
    ImplSpec(
        "ring",
        "zigzag",
        f"{_E}:ring",
        "zigzag ring, K/V packed, batched async p2p overlapped with compute; dilated: contiguous "
        "chunks, a segment's sparse K/V sent only among the ranks it covers",
        dilated_placement="contiguous",
        one_rank_is_t1=True,
    )
)
register_impl(
    ImplSpec(
        "ring_naive",
        "contiguous",
        f"{_E}:ring_naive",
        "contiguous ring without overlap (what balancing and overlap buy)",
        one_rank_is_t1=True,
    )
)
register_impl(
    ImplSpec(
        "ring_lp",
        "zigzag",
        f"{_E}:ring_lp",
        "ring with the backward's travelling dK/dV in the input dtype (bf16), not fp32 sums: half their bytes",
        patterns=("dense",),
        one_rank_is_t1=True,
    )
)
register_impl(ImplSpec("allgather", "zigzag", f"{_E}:allgather", "Llama-3 style: all-gather K/V, Q local"))
register_impl(
    ImplSpec(
        "ulysses", "contiguous", f"{_E}:ulysses", "all-to-all over heads", heads_divisor=_whole, one_rank_is_t1=True
    )
)
register_impl(
    ImplSpec(
        "usp",
        "usp",
        "sweepbench.attention.usp:usp",
        "Ulysses inside groups of usp_degree(W) ranks x zigzag ring across them (USP)",
        heads_divisor=usp_degree,
        one_rank_is_t1=True,
    )
)
register_impl(
    ImplSpec(
        "torch_cp",
        "zigzag",
        "sweepbench.attention.torch_cp:torch_cp_attention",
        "torch.distributed.tensor.experimental.context_parallel (head-tail load balancer)",
        device_types=("cuda",),
        patterns=("dense",),
        causal_only=True,
        context="sweepbench.attention.torch_cp:torch_cp_context",
        own_comm=False,
        captures=False,  # its context swaps SDPA's dispatch for DTensor's around each call
    )
)


def get_impl(name: str) -> ImplSpec:
    return IMPLS.get(name)


def placement_of(impl: str, pattern: str = "dense") -> str:
    """How ``impl`` expects the sequence laid out over the ranks for ``pattern`` (see ``shard_sequence``)."""
    return get_impl(impl).placement_for(pattern)


def why_not(
    impl: str,
    *,
    device_type: str,
    world_size: int,
    num_heads: int,
    pattern: str,
    causal: bool,
    ignore_device: bool = False,
) -> str | None:
    """None if ``impl`` can run this case, else why not and which impls would (one line);
    ``ignore_device``: the checks that hold wherever the ranks compute."""
    spec = get_impl(impl)
    if ignore_device and device_type not in spec.device_types:
        device_type = spec.device_types[0]

    def others(ok: Callable[[ImplSpec], bool]) -> str:
        return ", ".join(s.name for s in IMPLS.values() if ok(s)) or "none"

    if device_type not in spec.device_types:
        return (
            f"impl={impl} runs on {'/'.join(spec.device_types)} only, not {device_type} "
            f"(on {device_type}: {others(lambda s: device_type in s.device_types)})"
        )
    if pattern not in spec.patterns:
        return (
            f"impl={impl} runs pattern={'/'.join(spec.patterns)} only (pattern={pattern}: "
            f"{others(lambda s: pattern in s.patterns)})"
        )
    if spec.causal_only and not causal:
        return (
            f"impl={impl} balances load only under a causal mask; use causal=true "
            f"(non-causal: {others(lambda s: not s.causal_only)})"
        )
    d = spec.heads_divisor(world_size) if spec.heads_divisor else 1
    if num_heads % d:
        what = "the ring size" if d == world_size else f"its Ulysses degree at W={world_size},"
        return (
            f"impl={impl} needs model.num_heads={num_heads} divisible by {what} {d} (use another cp, or impl="
            f"{others(lambda s: not s.heads_divisor or num_heads % s.heads_divisor(world_size) == 0)})"
        )
    return None
