"""Summing block results with the precision of an fp32 accumulator but no more passes than needed.

A kernel returns each block's output (or gradient) in the input dtype (bf16), already rounded once.
Summing two such terms in place in bf16 rounds once more, exactly what an fp32 accumulator cast to
bf16 at the end gives (the add runs in fp32 and rounds once); only a third term needs an fp32
accumulator in between. So where a rank sees two terms (the common case, W=2) no fp32 tensor, no
zero fill and no cast pass is made; from the third term on, the sum is kept in fp32.

``Merged``: the LSE-weighted merge of block outputs (attention over the union of their keys).
``RowSum``: the plain sum of gradient terms, each over a slice of the rows (dim 2)."""

from __future__ import annotations

import functools

import torch

_FULL = slice(None)


def _covers(rows: slice, x: torch.Tensor, length: int) -> bool:
    return x.shape[2] == length and rows.indices(length) == (0, length, 1)


@functools.cache
def _kernel():
    """The Triton merge module, or None where Triton is not installed (looked up once)."""
    try:
        from sweepbench.attention import merge_kernel
    except ImportError:
        return None
    return merge_kernel


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block into ``out`` and ``lse`` (fp32), in place: out = (1 - w) * out + w * out_b with
    w = sigmoid(lse_b - lse) = exp(lse_b - logaddexp(lse, lse_b)); lse = logaddexp(lse, lse_b).
    The math is fp32 whatever ``out``'s dtype: fp32 (an accumulator) or the blocks' dtype (the last
    merge, rounded once). On CUDA, one Triton kernel (``merge_kernel``); elsewhere two passes:
    w * out_b into an fp32 temporary, then one fused multiply-add written into ``out``."""
    if out.is_cuda and (kernel := _kernel()) is not None and kernel.fits(out, lse, block_out, block_lse):
        kernel.merge(out, lse, block_out, block_lse)
        return
    w = torch.sigmoid(block_lse - lse).unsqueeze(-1)
    torch.addcmul(block_out * w, out, 1 - w, out=out)
    lse.copy_(torch.logaddexp(lse, block_lse))


class Merged:
    """The LSE merge of block outputs over the local query rows. The first block, if it covers all
    rows, is kept as the kernel gave it; a merge marked ``last`` writes in that dtype (fp32 math);
    earlier merges need the fp32 accumulator."""

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    def add(self, rows: slice, o: torch.Tensor, lse: torch.Tensor, *, last: bool) -> None:
        n = self.q.shape[2]
        if self.out is None and _covers(rows, o, n):
            self.out, self.lse = o, lse
            return
        if self.out is None:
            b, h, _, d = self.q.shape
            self.out = torch.zeros(b, h, n, d, dtype=torch.float32, device=self.q.device)
            self.lse = torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=self.q.device)
        elif not last and self.out.dtype != torch.float32:
            self.out = self.out.float()
        assert self.lse is not None
        merge_(self.out[:, :, rows], self.lse[:, :, rows], o, lse)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The output in q's dtype and the fp32 LSE (rows no block touched: output 0, LSE -inf)."""
        if self.out is None:
            self.add(_FULL, *_empty(self.q), last=True)
        assert self.out is not None and self.lse is not None
        return self.out.to(self.q.dtype), self.lse


def _empty(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, n, _ = q.shape
    return torch.zeros_like(q), torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=q.device)


class RowSum:
    """The sum of terms over row slices (dim 2) of a ``shape`` tensor: up to two terms are kept as
    given and added once in ``result`` (one rounding); a third starts an fp32 accumulator."""

    def __init__(self, shape: torch.Size | tuple[int, ...], *, device: torch.device) -> None:
        self.shape, self.device = tuple(shape), device
        self.terms: list[tuple[slice, torch.Tensor]] = []
        self.acc: torch.Tensor | None = None

    def add(self, rows: slice, x: torch.Tensor) -> None:
        if self.acc is not None:
            self.acc[:, :, rows] += x
            return
        self.terms.append((rows, x))
        if len(self.terms) > 2:
            self.acc = self._fold(torch.float32)

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        """The sum in ``dtype`` (an fp32 sum cast once, or a sum of two terms rounded once)."""
        return (self.acc if self.acc is not None else self._fold(dtype)).to(dtype)

    def _fold(self, dtype: torch.dtype) -> torch.Tensor:
        terms, self.terms = self.terms, []
        n = self.shape[2]
        # an owned full-size term is the base (in place): fp32 if one is, else one of the final dtype
        full = [i for i, (r, x) in enumerate(terms) if _covers(r, x, n) and x.dtype in (torch.float32, dtype)]
        full.sort(key=lambda i: terms[i][1].dtype != torch.float32)
        if full:
            base = terms.pop(full[0])[1]
        else:
            wide = dtype if all(x.dtype == dtype for _, x in terms) else torch.float32
            base = torch.zeros(self.shape, dtype=wide, device=self.device)
        for rows, x in terms:
            base[:, :, rows] += x
        return base
