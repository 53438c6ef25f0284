"""``ipc``: destinations pull their pieces straight out of the senders' GPU memory with
device-to-device copies (copy engines, not NCCL kernels), as NeMo-RL and checkpoint-engine do
for collocated refit. Across nodes the pieces still go over NCCL (batched send/recv).

On its first run the executor exchanges CUDA IPC handles of every rank's source shards (one
``all_gather_object``) and caches the opened peer views with the plan's executor: later runs
only copy. Every pull is one contiguous device-to-device ``cudaMemcpy`` (a copy engine): a region
that is strided in its sender's shard (a column slice of a row-parallel weight, as in tp2 -> tp4)
is first packed by its sender into a contiguous export buffer on its own GPU, in its own process.
Pulled straight out of the strided view instead, the copy is an elementwise kernel that the
receiver's process launches on the sender's GPU, where it time-slices against the sender's own
kernels (its NCCL barrier spinning among them). Pulled as one ``cudaMemcpy2DAsync`` instead (a copy
engine reading rows at the shard's pitch, nothing packed), the same regions measured slower on
4x H200 (llama3_8b tp2 -> tp4 and tp2pp2 -> tp4pp1, two interleaved rounds): packing is kept. Each run is framed by two stream-ordered barriers (a one-element NCCL all-reduce):
the first makes the senders' shards ready before any peer reads them, the second keeps a sender
from changing its shards (or freeing them) while a peer still reads, and makes the refit end
when the last destination has its weights. Pulls from different peers go on separate streams,
so the copy engines of several links work at once.

Needs CUDA tensors, an NCCL default group and the same source shard tensors (same addresses)
on every run; on CPU/gloo it is a RuntimeError (and benchmark validation refuses it earlier,
as it refuses backend=nvshmem without a GPU). Not exercised by the CPU test suite beyond that
error; checked on GPUs by the GPU cases.
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from . import cuda_ipc
from .boxes import box_slices
from .comm import Shards
from .p2p import SendRecv
from .plan import Route
from .strategies import STRATEGIES


@STRATEGIES.register("ipc")
class IpcPull(SendRecv):
    """Same-node remote routes: pulled by the receiver over CUDA IPC. Other remote routes:
    ``send_recv`` buckets (``self.buckets`` keeps only those)."""

    def setup(self) -> None:
        self.device = cuda_ipc.require_cuda("strategy 'ipc'")
        if dist.get_backend(self.group) != "nccl":
            raise RuntimeError(f"strategy 'ipc' needs an NCCL process group, got {dist.get_backend(self.group)}")
        node = cuda_ipc.node_ids()
        self.buckets = tuple(b for b in self.buckets if any(node[d] != node[b.src] for d in b.dsts))
        super().setup()  # send_recv's one stage, of the buckets left to NCCL
        self.pulls: dict[int, list[tuple[int, Route]]] = {}  # sender -> (route index, route) I pull from it
        self.exported: dict[int, Route] = {}  # route index -> my routes same-node peers read
        self.served = 0  # bytes same-node peers pull from me
        for i, r in enumerate(self.plan.routes):
            for d, _ in () if r.is_local else r.dsts:
                if node[d] != node[r.src]:
                    continue
                if d == self.rank:
                    self.pulls.setdefault(r.src, []).append((i, r))
                if r.src == self.rank:
                    self.exported[i] = r
                    self.served += r.nbytes
        # torch runs a cross-device copy on the *source* device's current stream, after waiting for
        # the destination device's current stream, and makes that stream wait for the copy. So per
        # sender: a stream on its device and one on ours that holds only the pulls (pulls from one
        # sender go one after another, different senders in parallel); the scatters of staged
        # pieces run on a third stream, overlapping the next pulls.
        self.pull_dst = {src: torch.cuda.Stream(device=self.device) for src in self.pulls}
        self.pull_src: dict[int, torch.cuda.Stream] = {}
        self.scatter = torch.cuda.Stream(device=self.device)
        self.staging: dict[Route, torch.Tensor] = {}
        self.packed: dict[int, torch.Tensor] = {}  # route index -> my contiguous copy of a strided region
        self.flag = torch.zeros(1, device=self.device)
        self.peers: dict[int, dict[str, torch.Tensor]] | None = None
        self.source_ptrs: dict[str, int] = {}

    def _open(self, src_shards: Shards, dst_shards: Shards) -> None:
        """Collective, first run only: exchange handles of what peers pull from me (a whole
        shard where their regions are contiguous in it, else a packing buffer per strided region,
        named ``#<route index>``), and make a contiguous staging buffer for each pull whose
        destination region is strided."""
        mine: dict[str, torch.Tensor] = {}
        for i, r in self.exported.items():
            region = src_shards[r.param][box_slices(r.src_box)]
            if region.is_contiguous():
                mine[r.param] = src_shards[r.param]
            else:
                mine[f"#{i}"] = self.packed[i] = torch.empty(r.shape, dtype=region.dtype, device=self.device)
        self.peers = cuda_ipc.exchange(mine, wanted_from=set(self.pulls))
        self.source_ptrs = {name: t.data_ptr() for name, t in mine.items() if not name.startswith("#")}
        for src, routes in self.pulls.items():
            self.pull_src[src] = torch.cuda.Stream(device=next(iter(self.peers[src].values())).device)
            for _, r in routes:
                if not dst_shards[r.param][box_slices(r.dst_box(self.rank))].is_contiguous():
                    self.staging[r] = torch.empty(r.shape, dtype=dst_shards[r.param].dtype, device=self.device)

    def _pack(self, src_shards: Shards) -> None:
        """My strided regions into their export buffers, on this rank's stream (before the
        first barrier, so a peer reads them only once they are written)."""
        for i, buf in self.packed.items():
            r = self.exported[i]
            buf.copy_(src_shards[r.param][box_slices(r.src_box)])

    def _barrier(self) -> None:
        dist.all_reduce(self.flag, group=self.group)

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        if self.peers is None:
            self._open(src_shards, dst_shards)
        elif any(src_shards[n].data_ptr() != p for n, p in self.source_ptrs.items()):
            raise RuntimeError(
                "strategy 'ipc' opened the source shards of its first run; pass the same "
                "tensors (updated in place) on every run"
            )
        assert self.peers is not None
        self._pack(src_shards)
        self._barrier()
        ready = torch.cuda.current_stream(self.device)
        self.scatter.wait_stream(ready)
        for src, routes in self.pulls.items():
            views, dst_stream = self.peers[src], self.pull_dst[src]
            dst_stream.wait_stream(ready)
            with torch.cuda.stream(dst_stream), torch.cuda.stream(self.pull_src[src]):
                for i, r in routes:
                    target = dst_shards[r.param][box_slices(r.dst_box(self.rank))]
                    staged = self.staging.get(r)
                    packed = views.get(f"#{i}")
                    source = views[r.param][box_slices(r.src_box)] if packed is None else packed
                    (target if staged is None else staged).copy_(source)
                    if staged is not None:
                        self.scatter.wait_stream(dst_stream)
                        with torch.cuda.stream(self.scatter):
                            target.copy_(staged)
        super().run(src_shards, dst_shards)  # cross-node buckets over NCCL, and the local copies
        for stream in (*self.pull_dst.values(), self.scatter):
            ready.wait_stream(stream)
        self._barrier()

    def traffic(self) -> tuple[int, int]:
        sent, recv = super().traffic()
        pulled = sum(r.nbytes for routes in self.pulls.values() for _, r in routes)
        return sent + self.served, recv + pulled
