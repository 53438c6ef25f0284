"""The ring's W ranks as threads on ONE GPU, verified against the single-device run: where only one GPU is
lent, this checks the ring's whole W-rank algorithm on the GPU's own kernels (the row views cuDNN is handed,
the dK/dV spans, the merges), which a CPU test (cpu_flash) cannot.

Each thread runs ``RingAttention``'s forward and backward as rank r of W (called directly, not through the
autograd engine, whose one CUDA worker thread would serialise the ranks into a deadlock). ``ThreadComm``
delivers each ring exchange to the neighbour thread as a device copy, in stream order. The ranks' output and
dq/dk/dv are gathered and held against the whole sequence on one GPU with the harness's tolerance
(``scaling.mismatch``, as the sweep verifies).

    python bench/gpu/ring_threads.py SEQ [SEQ ...]     # env: W (2), KVH (32), BACKEND (cudnn), CAUSAL (1),
                                                       # DEVICE (cuda; cpu with BACKEND=cpu_flash checks the script)

Prints one line per sequence length: ``ok`` or the mismatches; exits 1 on any mismatch."""
from __future__ import annotations

import os
import queue
import sys
import threading

import torch

from sweepbench.attention.comm import Comm
from sweepbench.attention.ops import get_backend, sdpa_attention
from sweepbench.attention.placement import shard_sequence, unshard_sequence
from sweepbench.attention.ring import RingAttention, RingOptions
from sweepbench.attention.scaling import Shape, make_inputs, mismatch


class ThreadComm(Comm):
    """Rank ``rank`` of ``size`` threads: a ring exchange puts copies of the sends in the neighbour's
    mailbox and takes this rank's from its own (same stream, so the copies are ordered)."""

    def __init__(self, rank: int, size: int, boxes: list[dict[bool, queue.Queue]]) -> None:
        self.group, self.rank, self.size, self.boxes = None, rank, size, boxes

    def ring_exchange(self, send, recv, *, reverse=False):
        dst = (self.rank + (-1 if reverse else 1)) % self.size
        sends = (send,) if isinstance(send, torch.Tensor) else tuple(send)
        recvs = (recv,) if isinstance(recv, torch.Tensor) else tuple(recv)
        self.boxes[dst][reverse].put([s.clone() for s in sends])
        for r, got in zip(recvs, self.boxes[self.rank][reverse].get(timeout=600)):
            assert r.shape == got.shape, f"rank {self.rank} expects {tuple(r.shape)}, was sent {tuple(got.shape)}"
            r.copy_(got)
        return Done()


class Done:
    """An exchange that finished when it was issued (the copies above ran on the caller's stream)."""

    def wait(self) -> None:
        pass


class Ctx:
    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors


def run(seq: int, w: int, kvh: int, backend: str, causal: bool) -> list[str]:
    dev = torch.device(os.environ.get("DEVICE", "cuda"))
    q, k, v, dout = make_inputs(Shape(1, 32, kvh, seq, 128), dtype=torch.bfloat16, device=dev, seed=0)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want_out = sdpa_attention(*leaves, backend=backend, causal=causal, scale=128 ** -0.5)
    want_out.backward(dout)
    want = [want_out.detach(), *(x.grad for x in leaves)]
    boxes = [{False: queue.Queue(), True: queue.Queue()} for _ in range(w)]
    got: list[list[torch.Tensor] | BaseException | None] = [None] * w

    def rank_main(r: int) -> None:
        try:
            mine = [shard_sequence(x, dim=2, rank=r, world_size=w, placement="zigzag") for x in (q, k, v, dout)]
            opt = RingOptions("zigzag", True, causal, 128 ** -0.5, get_backend(backend), ThreadComm(r, w, boxes))
            ctx = Ctx()
            out = RingAttention.forward(ctx, *mine[:3], opt)
            dq, dk, dv, _ = RingAttention.backward(ctx, mine[3])
            got[r] = [out, dq, dk, dv]
        except BaseException as err:  # noqa: BLE001 (reported by the main thread)
            got[r] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    errors = [f"rank {r}: {g!r}" for r, g in enumerate(got) if isinstance(g, BaseException)]
    if errors:
        return errors
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        whole = unshard_sequence([g[i] for g in got], dim=2, world_size=w, placement="zigzag")  # type: ignore[index]
        if e := mismatch(name, whole, want[i]):
            errors.append(e)
    return errors


def main() -> int:
    w, kvh = int(os.environ.get("W", "2")), int(os.environ.get("KVH", "32"))
    backend, causal = os.environ.get("BACKEND", "cudnn"), os.environ.get("CAUSAL", "1") == "1"
    bad = 0
    for seq in map(int, sys.argv[1:]):
        errors = run(seq, w, kvh, backend, causal)
        bad += bool(errors)
        print(f"ring W={w} threads seq={seq} kvh={kvh} {backend} causal={causal}: "
              f"{'ok' if not errors else '; '.join(errors)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
