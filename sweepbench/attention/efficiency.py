"""The two scaling efficiencies of context-parallel attention, defined once (no torch: the pages
read them on the driver's path).

Both compare W GPUs against one: W GPUs are ideal when they take 1/W of the time one GPU would
need for the same work. Attention's FLOPs grow as the square of the length, causal or not (a causal
mask halves the pairs at every length alike), so one GPU at the per-GPU length L/W does 1/W² of
the whole work, and W of those runs do 1/W of it: the same work one GPU of the W does."""

from __future__ import annotations


def efficiency(t1_s: float, tw_s: float, world_size: int) -> float:
    """T1 / (W · T_W): T1 is one GPU over the whole length L, T_W is W GPUs over L."""
    return t1_s / (world_size * tw_s)


def efficiency_local(t1_local_s: float, tw_s: float, world_size: int) -> float:
    """W · T1(L/W) / T_W(L): one GPU at the per-GPU length L/W against W GPUs over L
    (ring-flash-attention's convention); it leaves out how much slower one GPU's kernel runs
    per FLOP at L than at L/W."""
    return world_size * t1_local_s / tw_s
