"""The ``megatron`` refit implementation: megatron-core's own refit
(``megatron.core.resharding.refit.swap_model_weights``) between two GPTModels built with
megatron's local layer spec (no Transformer Engine), the training one on the source layout's
ranks and the inference one on the destination's, with the same shapes, degrees and rank
placement as this package's layouts (tp fastest, then cp, ep, dp, pp).

Weights are deterministic as in ``materialize``: element ``i`` of the *canonical* tensor (the
full tensor a tp1/pp1/ep1 model holds, experts numbered globally) has a value fixed by (seed,
name, i). A rank's shard of a megatron parameter maps to boxes of the canonical tensor through
megatron's own attributes (``partition_dim``, ``partition_stride``: a strided shard holds chunks
r, r+W, ... of W*stride), so the source model is filled and the inference model checked bit for
bit without megatron's help. Copy services follow our backend: nccl -> NCCLCopyService, gloo ->
GlooCopyService, nvshmem -> NVSHMEMCopyService.
"""

from __future__ import annotations

import re
import types
from typing import Any, Mapping

import torch
import torch.distributed as dist

from .boxes import Box, box_slices
from .comm import subgroup
from .impls import IMPLS, missing
from .layout import Layout
from .materialize import bit_equal, fill_box
from .specs import ModelShape, torch_dtype

try:
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.resharding.copy_services.gloo_copy_service import GlooCopyService
    from megatron.core.resharding.refit import swap_model_weights
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        get_expert_parallel_rng_tracker_name,
        model_parallel_cuda_manual_seed,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig
except ImportError as e:  # the extra is not installed: one line naming the install command
    raise ImportError(missing("megatron") or f"benchmark.impl=megatron cannot import megatron-core: {e}") from None

# pg_collection field -> the layout axes its groups span (megatron's own test builds the same)
GROUPS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "pp": ("pp",),
    "ep": ("ep",),
    "dp": ("dp",),
    "tp_cp": ("tp", "cp"),
    "mp": ("tp", "cp", "ep", "pp"),
    "tp_ep": ("tp", "ep"),
    "tp_ep_pp": ("tp", "ep", "pp"),
    "dp_cp": ("cp", "dp"),
    "tp_dp_cp": ("tp", "cp", "dp"),
    "expt_tp": ("tp",),
    "expt_dp": ("dp",),
}
_EXPERT = re.compile(r"local_experts\.(\d+)\.")


def _enumerate(layout: Layout, axes: tuple[str, ...]) -> list[list[int]]:
    """Groups of ``layout``'s global ranks that differ only along ``axes``."""
    pl = layout.placement
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, rank in enumerate(layout.ranks):
        c = pl.coords(i)
        groups.setdefault(tuple(v for a, v in sorted(c.items()) if a not in axes), []).append(rank)
    return list(groups.values())


def _new_groups(enum: list[list[int]], rank: int) -> Any:
    """Collective (every rank, same order): a group per entry, shared with every other user of the
    same rank set (``comm.subgroup``); the one holding ``rank``, or None."""
    mine = None
    for ranks in enum:
        g = subgroup(ranks)
        mine = g if rank in ranks else mine
    return mine


def build_pg_collection(layout: Layout, rank: int) -> ProcessGroupCollection | None:
    """Megatron's process groups for ``layout`` (None on ranks outside it). Collective."""
    pgs = ProcessGroupCollection()
    for name, axes in GROUPS.items():
        setattr(pgs, name, _new_groups(_enumerate(layout, axes), rank))
    pp_groups = _enumerate(layout, ("pp",))
    pgs.embd = _new_groups([sorted({g[0], g[-1]}) for g in pp_groups], rank)
    pgs.pos_embd = _new_groups([[g[0]] for g in pp_groups], rank)
    return pgs if rank in layout.ranks else None


def _config(m: ModelShape, layout: Layout, device: torch.device) -> TransformerConfig:
    pl = layout.placement
    moe = (
        {"num_moe_experts": m.num_experts, "moe_ffn_hidden_size": m.ffn_hidden_size, "moe_router_topk": m.moe_top_k}
        if m.is_moe
        else {}
    )
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_heads,
        num_query_groups=m.num_kv_heads,
        ffn_hidden_size=m.ffn_hidden_size,
        kv_channels=m.head_dim,
        tensor_model_parallel_size=pl.tp,
        pipeline_model_parallel_size=pl.pp,
        expert_model_parallel_size=pl.ep,
        context_parallel_size=pl.cp,
        params_dtype=torch_dtype(m.dtype),
        pipeline_dtype=torch_dtype(m.dtype),
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=device.type != "cuda",
        # megatron's layers set the TP attributes the planner reads (partition_dim, stride) only in
        # their initialisation path: run it, with an init that leaves the weights alone (we fill them)
        perform_initialization=True,
        init_method=_keep,
        output_layer_init_method=_keep,
        embedding_init_method=_keep,
        **moe,
    )


def _keep(weight: torch.Tensor) -> None:
    """An init_method that leaves the weight as it is."""


def seed_rng_tracker(seed: int) -> None:
    """Seed megatron's CUDA RNG tracker once per process; a later call (the job's other model, the
    next job in the same process) reuses it. megatron's GPU init path forks the tracker's
    model-parallel and expert-parallel states (our init draws no value from them), and the tracker
    refuses a seed it already holds ("seed 1234 already exists", in every megatron-core from 0.16
    to 0.19): megatron's own ``model_parallel_cuda_manual_seed`` gives each state its own seed. The
    ranks are passed (0) because megatron's global parallel_state is never initialised here."""
    names = {"model-parallel-rng", get_expert_parallel_rng_tracker_name()}
    if names <= set(get_cuda_rng_tracker().get_states()):
        return
    model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0)


def absent_groups() -> types.SimpleNamespace:
    """The process groups of a model this rank holds no part of: every model-parallel group absent
    (None), data parallel over the world. megatron-core 0.19 reads all four for its plan's cache key
    (``pg.tp.size() if pg.tp else 1``, ...); 0.16 only ``dp``."""
    return types.SimpleNamespace(tp=None, pp=None, ep=None, dp=dist.group.WORLD)


class _Absent(torch.nn.Module):
    """The model on a rank that holds no part of it (non-collocated): no parameters."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.pg_collection = absent_groups()


def build_model(m: ModelShape, layout: Layout, rank: int, device: torch.device) -> torch.nn.Module:
    """Collective: the GPTModel of ``layout`` on this rank (uninitialised weights)."""
    pgs = build_pg_collection(layout, rank)
    config = _config(m, layout, device)
    if device.type == "cuda":  # the CPU init path (use_cpu_initialization) forks no CUDA state
        seed_rng_tracker(1234)
    if pgs is None:
        return _Absent(config)
    stage, stages = pgs.pp.rank(), pgs.pp.size()
    spec = get_gpt_layer_local_spec(num_experts=m.num_experts or None, normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=m.vocab_size,
        max_sequence_length=max(m.seq_len, 1),
        pre_process=stage == 0,
        post_process=stage == stages - 1,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        pg_collection=pgs,
    )
    return model.to(device)


def canonical_boxes(model: torch.nn.Module) -> dict[str, tuple[str, tuple[int, ...], list[tuple[Box, Box]]]]:
    """param name -> (canonical name, canonical shape, [(local box, canonical box)])."""
    pgs = getattr(model, "pg_collection", None)
    if isinstance(model, _Absent) or pgs is None:
        return {}
    layer_base = {}  # local layer index -> global, from megatron's 1-based layer_number
    for name, mod in model.named_modules():
        if name.startswith("decoder.layers.") and name.count(".") == 2:
            layer_base[name] = f"decoder.layers.{mod.layer_number - 1}"
    ep_rank, ep = pgs.ep.rank(), pgs.ep.size()
    config: Any = model.config  # megatron's TransformerConfig
    num_experts = config.num_moe_experts or 0
    out = {}
    for name, p in model.named_parameters():
        head = ".".join(name.split(".")[:3])
        cname = layer_base.get(head, head) + name[len(head) :] if head in layer_base else name
        expert = _EXPERT.search(cname)
        if expert:
            gidx = ep_rank * (num_experts // ep) + int(expert.group(1))
            cname = cname[: expert.start()] + f"local_experts.{gidx}." + cname[expert.end() :]
        shape = list(p.shape)
        pieces: list[tuple[Box, Box]] = [(tuple((0, n) for n in shape), tuple((0, n) for n in shape))]
        if getattr(p, "tensor_model_parallel", False):
            dim, stride = int(getattr(p, "partition_dim")), int(getattr(p, "partition_stride", 1))
            world, r = pgs.tp.size(), pgs.tp.rank()
            chunk = shape[dim] // stride
            pieces = []
            for j in range(stride):
                loc = [(0, n) for n in shape]
                glob = list(loc)
                loc[dim] = (j * chunk, (j + 1) * chunk)
                g = j * world + r
                glob[dim] = (g * chunk, (g + 1) * chunk)
                pieces.append((tuple(loc), tuple(glob)))
            shape[dim] *= world
        out[name] = (cname, tuple(shape), pieces)
    return out


def _expected(
    p: torch.Tensor, cname: str, shape: tuple[int, ...], pieces: list[tuple[Box, Box]], seed: int
) -> torch.Tensor:
    out = torch.empty_like(p)
    for loc, glob in pieces:
        fill_box(out[box_slices(loc)], shape, glob, seed=seed, name=cname)
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:  # a source checkout on the path
        return "(unknown version)"


def _copy_service(backend: str) -> Any:
    """Megatron's copy service for our backend (its own objects; cached by megatron per name)."""
    if backend == "gloo" and not torch.cuda.is_available():
        return _HostGlooCopyService()
    return {"nccl": "nccl", "gloo": "gloo", "nvshmem": "nvshmem"}[backend]


class _HostGlooCopyService(GlooCopyService):
    """megatron-core 0.16.1's GlooCopyService makes a CUDA stream in its constructor even though
    its ``run`` skips a missing one; on a CPU-only torch that raises. Same state, no stream."""

    def __init__(self) -> None:  # noqa: D107 - mirrors GlooCopyService.__init__ minus the stream
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.gloo_pg = dist.new_group(backend="gloo")
        self.send_ops: list[Any] = []
        self.recv_ops: list[Any] = []
        self._copy_stream = None


class MegatronTransfer:
    """Both models on this rank, megatron's copy service, and our fill / check of the weights."""

    def __init__(
        self, src: Layout, dst: Layout, *, model: Any, backend: str, rank: int, device: torch.device, seed: int
    ) -> None:
        m = ModelShape.from_config(model)
        self.seed, self.rank = seed, rank
        self.src_model = build_model(m, src, rank, device)
        self.dst_model = build_model(m, dst, rank, device)
        self.service = _copy_service(backend)
        self.method = f"megatron-core {_version()} swap_model_weights, {backend} copy service"
        self.dst_boxes = canonical_boxes(self.dst_model)
        with torch.no_grad():
            src_boxes = canonical_boxes(self.src_model)
            for name, p in self.src_model.named_parameters():
                p.copy_(_expected(p, *src_boxes[name], seed))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(c for c, _, _ in self.dst_boxes.values()))
        self.plan_digest = f"megatron:{len({c for names in everyone for c in names})} params"

    def step(self) -> None:
        swap_model_weights(self.src_model, self.dst_model, refit_method=self.service)

    def poison(self) -> None:
        with torch.no_grad():
            for p in self.dst_model.parameters():
                p.fill_(float("nan"))

    def verify(self) -> list[str]:
        problems = []
        for name, p in self.dst_model.named_parameters():
            cname, shape, pieces = self.dst_boxes[name]
            want = _expected(p, cname, shape, pieces, self.seed)
            if not bit_equal(p.detach(), want):
                bad = int((p.detach().float() != want.float()).sum())
                problems.append(
                    f"rank {self.rank}: megatron {name!r} ({cname}) differs ({bad} of {want.numel()} elements)"
                )
        return problems

    def traffic(self) -> tuple[int, int]:
        """Remote bytes of megatron's cached plan for this rank (known after the first step)."""
        plan = getattr(self.dst_model, "_cached_reshard_plan", None)
        if plan is None:
            return 0, 0
        src = dict(self.src_model.named_parameters())
        dst = dict(self.dst_model.named_parameters())

        def size(params: Mapping[str, torch.Tensor], op: Any) -> int:
            t = params[op.param_name][op.my_slice]
            return t.numel() * t.element_size()

        sent = sum(size(src, op) for op in plan.send_ops if op.peer_rank != self.rank)
        recv = sum(size(dst, op) for op in plan.recv_ops if op.peer_rank != self.rank)
        return sent, recv


@IMPLS.register("megatron")
def build(
    src: Layout, dst: Layout, *, model: Any, backend: str, rank: int, device: torch.device, seed: int, **_: Any
) -> MegatronTransfer:
    return MegatronTransfer(src, dst, model=model, backend=backend, rank=rank, device=device, seed=seed)
