"""``nvshmem``: one-sided pull through torch symmetric memory (GPU only, single node).

Each sender packs its outgoing buckets into its own symmetric staging buffer at
offsets derived from the plan (identical on every rank, so no handshake); after a
stream-ordered barrier (a tiny NCCL all-reduce) every receiver copies its regions
straight out of the sender's buffer (peer memory over NVLink via ``get_buffer``); a
second barrier lets the staging buffers be reused on the next run.  The allocation backend is
``NVSHMEM`` by default (``symm_backend="CUDA"`` uses plain CUDA IPC memory).

Needs: CUDA tensors, an NCCL default group, and a torch build where
``torch.distributed._symmetric_memory.is_nvshmem_available()``; otherwise a
RuntimeError says what is missing.  Not exercised by the CPU test suite; checked
on GPUs by ``tests/parallel/gpu_smoke.py``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .boxes import box_slices
from .comm import DEFAULT_BUCKET_BYTES, Bucket, Executor, Shards, make_buckets
from .plan import Plan
from .strategies import STRATEGIES

_ALIGN = 256


def _symm_mem(backend: Any) -> Any:
    if not torch.cuda.is_available():
        raise RuntimeError("strategy 'nvshmem' needs CUDA GPUs; torch.cuda.is_available() is False")
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:  # pragma: no cover - depends on the torch build
        raise RuntimeError(f"strategy 'nvshmem' needs torch.distributed._symmetric_memory: {e}") from e
    if backend == "NVSHMEM" and not symm_mem.is_nvshmem_available():
        raise RuntimeError(
            "strategy 'nvshmem' needs NVSHMEM, but torch.distributed._symmetric_memory."
            "is_nvshmem_available() is False (torch built without NVSHMEM or libnvshmem missing); "
            "pass symm_backend='CUDA' to use CUDA symmetric memory instead"
        )
    if symm_mem.get_backend(torch.device("cuda")) != backend:
        symm_mem.set_backend(backend)  # fails if another backend already allocated
    return symm_mem


# (group name, device) -> (staging tensor, handle): one buffer reused by every executor
# (symmetric allocations are collective, so grow it rarely and identically on all ranks)
_STAGING: dict[tuple[str, str], tuple[torch.Tensor, Any]] = {}


def _staging(symm_mem: Any, group: Any, device: torch.device, size: int) -> tuple[torch.Tensor, Any]:
    key = (group.group_name, str(device))
    cached = _STAGING.get(key)
    if cached is None or cached[0].numel() < size:
        tensor = symm_mem.empty(size, dtype=torch.uint8, device=device)
        cached = _STAGING[key] = (tensor, symm_mem.rendezvous(tensor, group=group))
    return cached


@STRATEGIES.register("nvshmem")
class SymmetricPull(Executor):
    def __init__(
        self,
        plan: Plan,
        *,
        group: Any = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        symm_backend: str = "NVSHMEM",
        device: str | torch.device | None = None,
    ) -> None:
        self.symm_backend = symm_backend
        self.device_arg = device
        super().__init__(plan, group=group, bucket_bytes=bucket_bytes)

    def setup(self) -> None:
        symm_mem = _symm_mem(self.symm_backend)
        d = self.device_arg
        self.device = torch.device("cuda", torch.cuda.current_device()) if d is None else torch.device(d)
        if self.device.type != "cuda":
            raise RuntimeError(f"strategy 'nvshmem' needs a cuda device, got {self.device}")
        # staging offset of every remote bucket inside its sender's buffer
        self.mine: list[tuple[Bucket, int]] = []
        used: dict[int, int] = {}
        for b in make_buckets(self.plan, self.bucket_bytes):
            nbytes = sum(r.nbytes for r in b.routes)
            if b.involves(self.rank):
                self.mine.append((b, used.get(b.src, 0)))
            used[b.src] = used.get(b.src, 0) + -(-nbytes // _ALIGN) * _ALIGN
        size = max(used.values(), default=0) or _ALIGN
        group: Any = self.group if self.group is not None else dist.group.WORLD
        self.staging, self.handle = _staging(symm_mem, group, self.device, size)
        self.peer = {r: dist.get_group_rank(group, r) for r in dist.get_process_group_ranks(group)}
        self.sync_group = group
        self.flag = torch.zeros(1, device=self.device)

    def _barrier(self) -> None:
        """Stream-ordered barrier: work queued before it on every rank's current stream
        finishes before work queued after it on any rank starts.  A tiny NCCL all-reduce
        (its stream waits for ours, ours for it).  ``handle.barrier()`` was seen letting
        peer reads race the sender's packing with the NVSHMEM backend (torch 2.11), so
        it is not used."""
        dist.all_reduce(self.flag, group=self.sync_group)

    def _view(self, b: Bucket, off: int, like: torch.Tensor, peer: int | None = None) -> torch.Tensor:
        nbytes = b.numel * like.element_size()
        raw: torch.Tensor
        if peer is None:
            raw = self.staging[off : off + nbytes]
        else:
            raw = self.handle.get_buffer(self.peer[peer], (nbytes,), torch.uint8, storage_offset=off)
        return raw.view(like.dtype)

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        self.copy_local(src_shards, dst_shards)
        for b, base in self.mine:
            if b.src == self.rank:
                like = src_shards[b.routes[0].param]
                if like.element_size() != self.plan.src.param(b.routes[0].param).itemsize:
                    raise ValueError("strategy 'nvshmem' needs shards in the layout's dtype")
                staged = self._view(b, base, like)
                for r, off in zip(b.routes, b.offsets):
                    n = r.nbytes // like.element_size()
                    staged[off : off + n].view(r.shape).copy_(src_shards[r.param][box_slices(r.src_box)])
        self._barrier()
        for b, base in self.mine:
            if self.rank in b.dsts:
                self.unpack(b, self._view(b, base, dst_shards[b.routes[0].param], peer=b.src), dst_shards)
        self._barrier()
