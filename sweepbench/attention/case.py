"""What one scaling case of the attention engine is, in typed objects (torch-free): its config
(``AttentionCase``, built once by the caller, the attention benchmark from its Hydra config) and
what ``runner.run_case`` measures of it, step by step (``Baseline``, ``Schedule``, ``Timings``,
gathered into ``CaseResult``, which ``summary.report_case`` turns into the recorded case)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from sweepbench.attention.dilated import Branch
    from sweepbench.attention.registry import ImplSpec
    from sweepbench.attention.scaling import Shape


@dataclass(frozen=True)
class AttentionCase:
    """The engine's one config: the shape, the impl and how it is timed and checked."""

    batch: int  # sequences
    heads: int  # query heads
    kv_heads: int  # key/value heads (GQA when < heads)
    head_dim: int
    seq_len: int  # tokens of the whole sequence, split over the ring of ranks
    dtype: str  # float32 | bfloat16 | float16
    causal: bool
    backward: bool  # time fwd+bwd (False: forward only)
    impl: str  # a registered impl (attention/registry.py): ring, allgather, ulysses, torch_cp...
    pattern: str  # dense | dilated (LongNet)
    segment_lengths: list[int]  # dilated: w of each branch
    dilation_rates: list[int]  # dilated: r of each branch
    sdpa_backend: str  # the impl's SDPA kernel; auto = T1's fastest
    rotate_method: str  # torch_cp's K/V rotation: allgather | alltoall
    warmup: int  # untimed iterations before each timing loop
    iters: int  # timed iterations of each loop
    t1_iters: int  # timed iterations of each single-device backend (rank 0)
    t1_prune_factor: float  # skip a backend this much slower than the best at a shorter length; 0 = time all
    t1_fault: str  # test knob: "" | exit | kill | raise | segfault, a first T1 candidate that does that
    seed: int  # of the inputs, the same on every rank
    t1_spare: bool = False  # T1's next child started ahead for the process's next job (t1.py)
    cuda_graph: bool = False  # fwd and bwd (T1's too) replayed from CUDA graphs (graphs.py)

    @property
    def shape(self) -> Shape:
        from sweepbench.attention.scaling import Shape

        return Shape(self.batch, self.heads, self.kv_heads, self.seq_len, self.head_dim)

    @property
    def branches(self) -> tuple[Branch, ...]:
        from sweepbench.attention.dilated import branches_of  # torch: not on the driver's path

        return branches_of(self.segment_lengths, self.dilation_rates)


@dataclass
class Baseline:
    """T1 (the whole sequence on one device, every SDPA backend that runs there) as rank 0 measured
    or reused it, and T1 at the per-GPU length where measured."""

    t1: dict[str, Any]  # t1.t1_and_reference's: stats and times_s by backend, refused, pruned, phase_s
    source: dict[str, Any]  # {"reused": bool, "measured": where and when, or None}
    backend: str  # T1's fastest backend
    local_s: float | None  # T1 at L/W (t1.t1_local)

    @property
    def stats(self) -> dict[str, dict[str, float]]:
        return self.t1["stats"]

    @property
    def reused(self) -> bool:
        return self.source["reused"]

    @property
    def median_s(self) -> float:
        return self.stats[self.backend]["median_s"]


@dataclass(frozen=True)
class Schedule:
    """How the impl runs this case: its spec, token layout and SDPA kernel, and which loops are timed."""

    spec: ImplSpec
    placement: str  # zigzag | contiguous
    backend: str  # the SDPA kernel the impl runs
    total_is_t1: bool  # W=1 running T1's kernel: fwd+bwd is T1's samples, not timed again

    @property
    def no_comm_loop(self) -> bool:
        """Timed again with local copies for communication (torch_cp's cannot be replaced)."""
        return self.spec.own_comm and not self.total_is_t1

    @property
    def steps(self) -> int:
        return 3 + self.no_comm_loop  # T1, verified, timed, and the same without communication


@dataclass
class Timings:
    """This rank's seconds per iteration of each loop (the slowest rank's, ``time_iterations``)."""

    fwd: list[float]
    bwd: list[float]  # [] without backward
    total: list[float]  # fwd+bwd
    own: list[float]  # fwd+bwd, this rank's own times
    no_comm: list[float] | None  # fwd+bwd with LocalComm; None where not timed
    memory: dict[str, Any]  # this rank's peaks (measure.memory.memory_peaks)


@dataclass
class CaseResult:
    """Everything ``summary.report_case`` reads of one case."""

    case: AttentionCase
    world_size: int
    device: torch.device
    schedule: Schedule
    baseline: Baseline
    timings: Timings
    per_rank: list[dict[str, Any]]  # each rank's fwd+bwd median, memory peaks and bytes sent
    context_entries: list[float]  # seconds of each entry of the impl's context, the slowest rank's
    phase_s: dict[str, float]  # wall seconds of T1+reference, verify, timing
