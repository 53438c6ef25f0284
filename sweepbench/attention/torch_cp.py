"""PyTorch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``),
wrapped as one more implementation: the peer to beat, timed and verified the same way.

torch's CP patches SDPA while its context is open, so the context must cover forward *and*
backward (``torch_cp_context``); inside it ``torch_cp_attention`` is a plain SDPA call on the local
shards. torch lays the sequence out with its head-tail load balancer, which is our ``zigzag``: the
context shards a position buffer itself and checks that. It rotates K/V by all-gather or
all-to-all (``rotate_method``). It runs on CUDA only (its ring handles the flash, efficient and
cuDNN SDPA ops). GQA kv heads are expanded before SDPA (torch's ring then rotates all heads)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sweepbench.attention.comm import Comm
from sweepbench.attention.ops import expand_kv
from sweepbench.attention.placement import positions

SDPA_KERNELS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


@contextmanager
def torch_cp_context(
    comm: Comm, *, seq_len: int, device: torch.device, rotate_method: str = "allgather", **_: Any
) -> Iterator[None]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    group = comm.group or dist.group.WORLD
    assert group is not None, "no process group: torch's CP runs inside an initialised one"
    mesh = DeviceMesh.from_group(group, device.type)
    set_rotate_method(rotate_method)
    pos = torch.arange(seq_len, device=device)[None]
    with context_parallel(mesh, buffers=[pos], buffer_seq_dims=[1], no_restore_buffers={pos}):
        expected = positions("zigzag", comm.rank, comm.size, seq_len).to(device)
        assert torch.equal(pos[0], expected), "torch's CP placement is not the zigzag placement"
        yield


def torch_cp_attention(q, k, v, **kw: Any) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    with sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kw["backend"].name])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=kw["causal"], scale=kw["scale"])
