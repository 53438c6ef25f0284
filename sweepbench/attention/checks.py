"""Can this attention case run? One-line ``ValueError``s naming the bad value and what would be
valid, checked before any rank starts (torch-free)."""

from __future__ import annotations

from sweepbench.attention.registry import IMPLS, PATTERNS, PLACEMENT_CHUNKS, SDPA_DEVICE, get_impl, why_not
from sweepbench.core import NotOnThisMachine


def _check_dilated(seq_len: int, chunk: int, segment_lengths: list[int], dilation_rates: list[int]) -> None:
    if len(segment_lengths) != len(dilation_rates) or not segment_lengths:
        raise ValueError(
            f"benchmark.segment_lengths={segment_lengths} and benchmark.dilation_rates="
            f"{dilation_rates} must be non-empty lists of the same length"
        )
    for w, r in zip(segment_lengths, dilation_rates):
        if w <= 0 or r <= 0:
            raise ValueError(f"segment length {w} and dilation rate {r} must be positive")
        if seq_len % w:
            raise ValueError(
                f"benchmark.seq_len={seq_len} is not divisible by segment length {w} "
                f"(valid: multiples of every segment length)"
            )
        if w % r:
            raise ValueError(f"dilation rate {r} does not divide its segment length {w} (valid rates: divisors of {w})")
        if chunk % w and (w % chunk or chunk % r):
            raise ValueError(
                f"segment length {w} neither divides nor is a multiple of the local chunk of {chunk} "
                f"tokens (with rate {r} dividing the chunk); use powers of two or another seq_len"
            )


def check_case(
    *,
    impl: str,
    pattern: str,
    seq_len: int,
    world_size: int,
    num_heads: int,
    causal: bool,
    segment_lengths: list[int],
    dilation_rates: list[int],
    device_type: str,
    sdpa_backend: str,
    batch_size: int,
    cuda_graph: bool = False,
) -> None:
    IMPLS.check(impl, key="benchmark.impl")
    if pattern not in PATTERNS:
        raise ValueError(f"benchmark.pattern={pattern!r} is not valid; choose one of {', '.join(PATTERNS)}")
    if seq_len <= 0 or batch_size <= 0:
        raise ValueError(f"benchmark.seq_len={seq_len} and benchmark.batch_size={batch_size} must be positive")
    placement = get_impl(impl).placement_for(pattern)
    n = world_size * PLACEMENT_CHUNKS[placement]
    if seq_len % n:
        what = f"2·W = {n} ({placement} placement of impl={impl})" if n > world_size else f"W = {n}"
        raise ValueError(f"benchmark.seq_len={seq_len} is not divisible by {what}; use a multiple of {n}")
    if pattern == "dilated":
        _check_dilated(seq_len, seq_len // n, segment_lengths, dilation_rates)
    reason = why_not(
        impl,
        device_type=device_type,
        world_size=world_size,
        num_heads=num_heads,
        pattern=pattern,
        causal=causal,
        ignore_device=True,
    )
    if reason:
        raise ValueError(reason)
    if cuda_graph and not get_impl(impl).captures:
        able = [name for name in IMPLS.names() if get_impl(name).captures]
        raise ValueError(
            f"benchmark.cuda_graph=true: impl={impl} cannot be captured as a CUDA graph; "
            f"valid: benchmark.cuda_graph=false, or impl {', '.join(able)}"
        )
    if sdpa_backend != "auto" and sdpa_backend not in SDPA_DEVICE:
        raise ValueError(
            f"benchmark.sdpa_backend={sdpa_backend!r} is not valid; choose auto or one of {', '.join(SDPA_DEVICE)}"
        )
    # last, the checks that depend on where the ranks compute (a dry run from a CPU login node notes them)
    reason = why_not(
        impl, device_type=device_type, world_size=world_size, num_heads=num_heads, pattern=pattern, causal=causal
    )
    if reason:
        raise NotOnThisMachine(reason)
    if cuda_graph and device_type != "cuda":
        raise NotOnThisMachine(
            f"benchmark.cuda_graph=true needs CUDA devices and these ranks compute on {device_type}; "
            f"valid there: benchmark.cuda_graph=false"
        )
    if sdpa_backend != "auto" and SDPA_DEVICE.get(sdpa_backend) != device_type:
        valid = [name for name, dev in SDPA_DEVICE.items() if dev == device_type]
        raise NotOnThisMachine(
            f"benchmark.sdpa_backend={sdpa_backend!r} does not run on {device_type}; valid: auto, {', '.join(valid)}"
        )
