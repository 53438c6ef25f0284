"""Who runs the collective benchmark's cases, by name (``benchmark.impl=torch,nccl_tests``): ours
(torch.distributed, timed by measure.timing) and peers, behind one interface so that one sweep
puts both in one results.csv. Torch-free: the driver checks a job against its implementation
before any rank starts; each entry points at its code ("module:function"), imported on the ranks.

An entry is called on every rank as ``run(ctx, cfg, grid, on_case)`` with the RankContext, the
benchmark config and the (op, size) grid, calls ``on_case(case)`` as each case is done, and
returns ``{"cases": [...], "sampling": {...}}`` (rank 0's counts); a wrong result raises
``collective.ops.Mismatch``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sweepbench.core import Registry, load_entry

# ops.OPS, torch-free for the driver (a test keeps the two the same list)
ALL_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# benchmark.buffers: where the torch impls allocate a case's buffers (ops.case_buffers)
BUFFERS = ("caching", "nccl")


def _runs_anywhere(cfg: Any, world_size: int) -> None:
    pass


@dataclass(frozen=True)
class CollectiveImpl:
    entry: str  # "module:function", see the module docstring
    summary: str
    # (job config, world size) -> None; ValueError (one line) where this impl cannot run the job
    check: Callable[[Any, int], None] = _runs_anywhere
    # the peer impl that times the same way of calling (graphs against graphs), its page reference
    reference: str = ""
    # a peer that allocates its buffers its own way, whatever benchmark.buffers says ("" = as configured)
    allocates: str = ""

    def load(self) -> Callable[..., dict[str, Any]]:
        return load_entry(self.entry)


IMPLS: Registry[CollectiveImpl] = Registry("collective implementation")


def get_impl(name: str) -> CollectiveImpl:
    return IMPLS.get(name, key="benchmark.impl")


def buffers_of(impl: str, configured: str) -> str:
    """Where a job's buffers came from: the peer's own allocation, else benchmark.buffers (an impl
    this install does not have, from an older run, counts as configured)."""
    return (IMPLS.get(impl).allocates if impl in IMPLS else "") or configured


def _check_nccl_tests(cfg: Any, world_size: int) -> None:
    from sweepbench.collective.nccl_tests import check_build

    check_build(cfg, world_size)


IMPLS.add(
    "torch",
    CollectiveImpl(
        "sweepbench.collective.ops:run_torch",
        "torch.distributed on every rank, timed by sweepbench",
        reference="nccl_tests",
    ),
)


def needs_gpus(cfg: Any, what: str, instead: str) -> None:
    """Refuse (one line) a job whose ``what`` runs on GPUs where its backend is not a GPU's; on
    backend=auto this machine has none, so the job is one this machine cannot run."""
    from sweepbench.config.validate import GPU_BACKENDS, resolve_backend
    from sweepbench.core import NotOnThisMachine

    if resolve_backend(cfg.backend.name) not in GPU_BACKENDS:
        raise (NotOnThisMachine if cfg.backend.name == "auto" else ValueError)(
            f"{what}: it runs on GPUs, not backend={cfg.backend.name}; use backend=nccl (or auto on a GPU machine), "
            f"or {instead}"
        )


def check_buffers(cfg: Any) -> None:
    """benchmark.buffers: one of BUFFERS; ``nccl`` (NCCL's allocator) on GPUs only, and for the impls
    that allocate as configured."""
    b = cfg.benchmark
    if b.buffers not in BUFFERS:
        raise ValueError(f"benchmark.buffers={b.buffers!r}; valid: {', '.join(BUFFERS)}")
    if b.buffers == "nccl" and not get_impl(b.impl).allocates:
        needs_gpus(cfg, "benchmark.buffers=nccl allocates through NCCL's allocator", "benchmark.buffers=caching")


def _check_cuda(cfg: Any, world_size: int) -> None:
    needs_gpus(cfg, "benchmark.impl=torch_graph captures CUDA graphs", "impl=torch")


IMPLS.add(
    "torch_graph",
    CollectiveImpl(
        "sweepbench.collective.ops:run_torch_graph",
        "torch.distributed, each sample's calls captured once as a CUDA graph and "
        "replayed (no host cost per call: nccl-tests -G); CUDA only",
        check=_check_cuda,
        reference="nccl_tests_graph",
    ),
)
IMPLS.add(
    "nccl_tests",
    CollectiveImpl(
        "sweepbench.collective.nccl_tests:run_cases",
        "NVIDIA's nccl-tests binaries (benchmark.nccl_tests_dir), one process driving every GPU of the node",
        check=_check_nccl_tests,
        allocates="nccl",
    ),
)
IMPLS.add(
    "nccl_tests_graph",
    CollectiveImpl(
        "sweepbench.collective.nccl_tests:run_cases_graph",
        "nccl_tests with CUDA graphs (-G 1): each sample's calls captured as "
        "one graph, launched once (what torch_graph times)",
        check=_check_nccl_tests,
        allocates="nccl",
    ),
)
