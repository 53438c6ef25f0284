"""An attention call's forward and backward, each replayed from a CUDA graph (``benchmark.cuda_graph``).

A context-parallel step of a few milliseconds issues tens of small kernels (gathers, merges, the
SDPA calls, point-to-point sends), and the host's launch of each can take longer than the kernel:
the step then times the host, not the device. Captured once, after warm-up, each phase is one
graph launch. torch's ``make_graphed_callables`` does the capture: it runs the call a few times
on a side stream (the warm-up: lazy set-ups such as NCCL's communicators and cuDNN's plans happen
there), captures the forward and the backward into two graphs whose memory is private to them,
and returns a function of the same inputs whose forward replays the first graph and whose
backward (through autograd, as before) replays the second. The inputs must be the same tensors at
every call (the leaves captured: nothing is copied in); the output and the gradients live in the
graphs' memory, so a caller that keeps them across calls copies them. The communication inside
(``Comm``'s NCCL calls) is captured with the kernels: every rank captures the same calls in the
same order. Nothing in the call may read a value back to the host (the engine's impls do not)."""

from __future__ import annotations

from typing import Callable, Sequence, cast

import torch


def graphed(fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn(*leaves)`` as a call that replays its forward's graph, whose backward replays the
    backward's graph; ``leaves`` (CUDA tensors that require grad) are its inputs at every call."""
    if not all(x.is_cuda and x.requires_grad for x in leaves):
        raise ValueError("a CUDA graph is captured over CUDA tensors that require grad")
    call = torch.cuda.make_graphed_callables(fn, tuple(leaves))
    args = tuple(leaves)

    def replay() -> torch.Tensor:
        return cast(torch.Tensor, call(*args))

    return replay
