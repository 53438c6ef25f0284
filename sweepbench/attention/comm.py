"""The communication an implementation does, behind one small object, so that the same schedule can
run with its communication replaced by local buffers (``LocalComm``): the difference of the two
times is the communication that stayed exposed (not hidden behind compute).

``LocalComm`` moves no bytes between ranks: a ring exchange copies the send buffer into the
receive buffer, an all-gather repeats the local tensor, an all-to-all copies its input. Results are
wrong by design; only its time is used.

Each ``Comm`` counts the bytes its rank sends (``traffic``, shared with the comms ``split`` makes):
what the other ranks must receive from this one, whatever algorithm the library picks (an
all-gather over g ranks: g-1 copies of the local tensor; a reduce-scatter or all-to-all: the g-1
parts meant for the others; point to point: each send). ``LocalComm`` counts nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from sweepbench.collective.ops import all_gather_tensor, reduce_scatter_tensor
from sweepbench.parallel.comm import subgroup


Tensors = torch.Tensor | tuple[torch.Tensor, ...]


def _tuple(x: Tensors) -> tuple[torch.Tensor, ...]:
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


class Pending(Protocol):
    def wait(self) -> None: ...


class _Done:
    def wait(self) -> None:
        pass


class _Works:
    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> None:  # idempotent: a second wait on a finished gloo p2p work can block
        works, self.works = self.works, []
        for w in works:
            w.wait()


@dataclass
class Traffic:
    sent_bytes: int = 0  # what this rank sent to other ranks (see the module docstring)


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


class Comm:
    """Real communication over ``group`` (None: the default group)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        on = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if on else 0  # no process group: a ring of one
        self.size = dist.get_world_size(group) if on else 1
        self.traffic = Traffic()

    @classmethod
    def solo(cls) -> "Comm":
        """A ring of one (attention on this device alone, e.g. inside Ulysses)."""
        comm = cls.__new__(cls)
        comm.group, comm.rank, comm.size, comm.traffic = None, 0, 1, Traffic()
        return comm

    def split(self, partition: list[list[int]]) -> "Comm":
        """A Comm of the same kind over the part of ``partition`` (lists of this comm's ranks) that
        holds this rank. Every rank of the default group makes every part's group, in the same order
        (torch's member-only group creation hangs once other groups exist), so this comm must span
        the default group; the groups are made once per default group (``parallel.comm.subgroup``)."""
        if self.size != dist.get_world_size():
            raise ValueError(
                f"splitting a group of {self.size} ranks needs it to be the whole default group "
                f"of {dist.get_world_size()} ranks"
            )
        mine = None
        for members in partition:
            group = subgroup(self._global(r) for r in members)
            if self.rank in members:
                mine = group
        assert mine is not None, f"rank {self.rank} is in no part of {partition}"
        part = type(self)(mine)
        part.traffic = self.traffic
        return part

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def ring_exchange(self, send: Tensors, recv: Tensors, *, reverse: bool = False) -> Pending:
        """Send ``send`` to the next rank and receive the previous rank's into ``recv`` (``reverse``:
        to the previous, from the next), one tensor or a tuple of them in one batch, asynchronous
        (``wait`` before reading ``recv`` or writing ``send``)."""
        sends, recvs = _tuple(send), _tuple(recv)
        if self.size == 1:
            for s, r in zip(sends, recvs):
                r.copy_(s)
            return _Done()
        step = -1 if reverse else 1
        nxt, prv = self._global((self.rank + step) % self.size), self._global((self.rank - step) % self.size)
        ops = [dist.P2POp(dist.isend, s, nxt, self.group) for s in sends]
        ops += [dist.P2POp(dist.irecv, r, prv, self.group) for r in recvs]
        self.traffic.sent_bytes += sum(_nbytes(s) for s in sends)
        return _Works(dist.batch_isend_irecv(ops))

    def send_recv(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> Pending:
        """Point to point with chosen peers (ranks of this comm, never this rank): each ``(peer, x)``
        of ``sends`` sent to ``peer``, each of ``recvs`` received from its peer, in one batch,
        asynchronous (``wait`` before reading a receive or writing a send). The ranks that call it
        must name each other (a send of p to q is a receive of q from p)."""
        assert all(p != self.rank for p, _ in sends + recvs), f"rank {self.rank} names itself as a peer"
        ops = [dist.P2POp(dist.isend, x.contiguous(), self._global(p), self.group) for p, x in sends]
        ops += [dist.P2POp(dist.irecv, x, self._global(p), self.group) for p, x in recvs]
        self.traffic.sent_bytes += sum(_nbytes(x) for _, x in sends)
        return _Works(dist.batch_isend_irecv(ops)) if ops else _Done()

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` stacked on a new leading dim, in rank order."""
        out = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
        if self.size == 1:
            out[0].copy_(x)
        else:  # the flat forms: gloo wants the output as the inputs concatenated on dim 0
            all_gather_tensor(out.view(-1), x.contiguous().view(-1), group=self.group)
            self.traffic.sent_bytes += (self.size - 1) * _nbytes(x)
        return out

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (W, ...) summed over ranks; this rank keeps entry ``rank``."""
        if self.size == 1:
            return x[0].clone()
        out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
        reduce_scatter_tensor(out.view(-1), x.contiguous().view(-1), group=self.group)
        self.traffic.sent_bytes += (self.size - 1) * _nbytes(out)
        return out

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (W, ...): entry j goes to rank j; the result's entry j came from rank j."""
        out = torch.empty_like(x)
        if self.size == 1:
            out.copy_(x)
        else:
            dist.all_to_all_single(out, x.contiguous(), group=self.group)
            self.traffic.sent_bytes += (self.size - 1) * _nbytes(x[0])
        return out


class LocalComm(Comm):
    """The same calls with no bytes crossing ranks (for the exposed-communication measure)."""

    def ring_exchange(self, send: Tensors, recv: Tensors, *, reverse: bool = False) -> Pending:
        for s, r in zip(_tuple(send), _tuple(recv)):  # a receive may be sized unlike the send (the ring's dK/dV)
            m = min(s.numel(), r.numel())
            r.view(-1)[:m].copy_(s.reshape(-1)[:m])
        return _Done()

    def send_recv(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> Pending:
        for _, r in recvs:  # nothing arrives: zeros, so that what reads them computes on finite numbers
            r.zero_()
        return _Done()

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0).repeat(self.size, *([1] * x.dim()))

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.rank].clone()

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def gather_sequence(comm: Comm, x: torch.Tensor, *, dim: int, placement: str) -> torch.Tensor:
    """Every rank's local ``x`` -> the whole sequence along ``dim``, in sequence order."""
    from sweepbench.attention.placement import unshard_sequence

    return unshard_sequence(list(comm.all_gather(x)), dim=dim, world_size=comm.size, placement=placement)


def reduce_scatter_sequence(comm: Comm, x: torch.Tensor, *, dim: int, placement: str) -> torch.Tensor:
    """A whole-sequence tensor (e.g. gradients of gathered K/V), summed over ranks, each rank
    keeping its own tokens (the backward of ``gather_sequence``)."""
    from sweepbench.attention.placement import shard_sequence

    per_rank = torch.stack(
        [shard_sequence(x, dim=dim, rank=j, world_size=comm.size, placement=placement) for j in range(comm.size)]
    )
    return comm.reduce_scatter(per_rank)
