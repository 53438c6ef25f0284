"""The first step's gradient norm that verification compares with the single-device reference:
on real gloo ranks, every layout's shards and copies count each element once (plain copies on
every rank, FSDP2 shards, uneven ones too, TP shards with replicated biases under FSDP2), and a
gradient scaled by a wrong factor is refused, where the loss after AdamW's first step could not
tell it."""

from __future__ import annotations

from typing import Any

import pytest


def _model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 6))


def _loss(model: Any, x: Any) -> Any:
    return model(x).square().mean()


def _layout_norm(rank: int, world_size: int, layout: str, scale: float) -> tuple[float, float, str]:
    """(reference norm, the layout's norm, the check's refusal or ''); the layout's gradient is
    multiplied by ``scale`` before it is measured."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from sweepbench.core import VerificationError
    from sweepbench.train.verify import check_grad_norm, grad_norm

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    ref = _model()
    _loss(ref, x).backward()
    reference = grad_norm([ref], pp=1, reduce=False)

    model = _model()
    if layout == "copies":  # DDP's result: the whole, averaged gradient on every rank
        _loss(model, x).backward()
    elif layout == "fsdp":
        fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
        rows = x.chunk(world_size)[rank]
        _loss(model, rows).backward()
    elif layout == "tp2_fsdp2":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        rows = x.chunk(2)[mesh["dp"].get_local_rank()]
        _loss(model, rows).backward()
    else:
        raise ValueError(layout)
    with torch.no_grad():
        for p in model.parameters():
            p.grad.mul_(scale)
    norm = grad_norm([model], pp=1, reduce=True)
    try:
        check_grad_norm(reference, norm, precision="fp32")
        refusal = ""
    except VerificationError as err:
        refusal = str(err)
    return reference, norm, refusal


@pytest.mark.parametrize("layout", ["copies", "fsdp", "tp2_fsdp2"])
def test_every_element_counts_once_and_a_scaled_gradient_is_refused(worlds: Any, layout: str) -> None:
    world = worlds.get(4)
    for reference, norm, refusal in world.run(_layout_norm, layout, 1.0):
        assert reference > 0
        assert norm == pytest.approx(reference, rel=1e-5)
        assert refusal == ""
    for reference, norm, refusal in world.run(_layout_norm, layout, 2.0):
        assert norm == pytest.approx(2 * reference, rel=1e-5)
        assert "step 0: gradient norm" in refusal and "differs from the single-device reference" in refusal
