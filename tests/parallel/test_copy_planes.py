"""Which regions the ipc strategy pulls as one 2D copy: ``cuda_ipc.plane`` and ``planes`` on the
slices refit's routes make (the copy itself needs GPUs: tests/parallel/gpu_smoke.py runs every
refit case with ipc bit-exact on them)."""

from __future__ import annotations

import torch

from sweepbench.parallel.boxes import box_slices
from sweepbench.parallel.cuda_ipc import plane, planes


def test_a_column_slice_is_rows_at_the_shards_pitch() -> None:
    shard = torch.empty(8, 6, dtype=torch.bfloat16)  # a row-parallel weight's shard: [out, in/2]
    cols = shard[box_slices(((0, 8), (3, 6)))]  # the receiver's quarter: [out, in/4]
    assert plane(cols) == (12, 6, 8)  # pitch 6 elements, rows of 3, 8 of them (bytes)
    assert plane(shard[2:5]) == (36, 36, 1)  # a row slice is contiguous: one row
    assert plane(shard[2:5, 1:4]) == (12, 6, 3)
    assert plane(torch.empty(4, 3, 8)[1:3, :, 2:6]) == (32, 16, 6)  # outer dims stepping by whole rows merge
    assert plane(torch.empty(4, 3, 8)[:, 1:, 2:6]) is None  # strided in two places
    assert plane(torch.empty(6, 4).t()) is None  # the last dim strided
    assert plane(torch.empty(1, 5)[:, 2:3]) == (4, 4, 1)


def test_planes_pairs_a_strided_side_with_a_contiguous_one_or_with_an_equal_slice() -> None:
    src = torch.empty(8, 6)[:, 3:]
    dst = torch.empty(8, 3)
    assert planes(dst, src) == ((12, 12, 8), (24, 12, 8))
    assert planes(src, dst) == ((24, 12, 8), (12, 12, 8))
    assert planes(torch.empty(8, 12)[:, 4:7], src) == ((48, 12, 8), (24, 12, 8))
    assert planes(torch.empty(3, 8).t(), src) is None  # the destination's last dim strided
    assert planes(torch.empty(8, 3, dtype=torch.float16), src) is None  # a cast is no copy
    assert planes(torch.empty(4, 6), src) is None  # shapes differ
