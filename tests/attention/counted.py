"""Rank functions of tests/attention/test_single.py (module level, so that spawned gloo ranks
import them): an impl with a context, registered for the tests only (the ring inside a context
that counts its entries and says whether it is open: torch_cp's structure on CPU/gloo), and a
case run against a store of T1 and the reference."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from sweepbench.attention import impls
from sweepbench.attention.case import AttentionCase
from sweepbench.attention.registry import IMPLS, ImplSpec, register_impl

NAME = "counted_ring"
COUNTS = {"entries": 0, "open": 0, "calls": 0, "calls_outside": 0}


@contextmanager
def counted_context(comm: Any, *, seq_len: int, device: torch.device, **_: Any) -> Iterator[None]:
    COUNTS["entries"] += 1
    COUNTS["open"] += 1
    try:
        yield
    finally:
        COUNTS["open"] -= 1


def counted_attention(q, k, v, **kw: Any) -> torch.Tensor:
    COUNTS["calls"] += 1
    COUNTS["calls_outside"] += COUNTS["open"] == 0
    return impls.ring(q, k, v, **kw)


if NAME not in IMPLS:
    register_impl(ImplSpec(NAME, "zigzag", f"{__name__}:counted_attention", "the ring, inside a counted context",
                           context=f"{__name__}:counted_context"))


def small_case(*, impl: str, warmup: int, iters: int) -> AttentionCase:
    """A dense causal case of 32 tokens, 2 heads of 8, fwd+bwd, one T1 iteration."""
    return AttentionCase(batch=1, heads=2, kv_heads=2, head_dim=8, seq_len=32, dtype="float32", causal=True,
                         backward=True, impl=impl, pattern="dense", segment_lengths=[], dilation_rates=[],
                         sdpa_backend="auto", rotate_method="allgather", warmup=warmup, iters=iters, t1_iters=1,
                         t1_prune_factor=0.0, t1_fault="", seed=0)


def run_counted(rank: int, world_size: int, warmup: int, iters: int) -> tuple[dict[str, Any], dict[str, int]]:
    from sweepbench.attention.runner import run_case

    COUNTS.update(entries=0, open=0, calls=0, calls_outside=0)
    case, _ = run_case(small_case(impl=NAME, warmup=warmup, iters=iters), rank=rank, world_size=world_size,
                       device=torch.device("cpu"))
    return case, dict(COUNTS)


def run_stored(rank: int, world_size: int, store_dir: str) -> tuple[bool, str | None]:
    """One ring case with rank 0 reading and writing the store in ``store_dir``: (T1 reused, the
    verification error or None)."""
    from sweepbench.attention.runner import run_case
    from sweepbench.core import VerificationError
    from sweepbench.measure.store import Store

    store = Store(Path(store_dir)) if rank == 0 else None
    try:
        case, _ = run_case(small_case(impl="ring", warmup=1, iters=1), rank=rank, world_size=world_size,
                           device=torch.device("cpu"), store=store)
    except VerificationError as err:
        return False, str(err)
    return case["t1_reused"], None
