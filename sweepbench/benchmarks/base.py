"""What a benchmark is: a class that runs on every rank and returns verified, timed results."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from omegaconf import DictConfig

from sweepbench.config.schema import BenchmarkConfig
from sweepbench.core import RankContext

if TYPE_CHECKING:  # torch is imported only where a job runs (ranks), never on the driver's path
    from matplotlib.figure import Figure


@dataclass
class BenchmarkResult:
    """What rank 0 reports. ``cases`` hold one dict per measured case (its parameters, timing
    statistics of the slowest rank, derived rates); ``summary`` holds the headline numbers."""

    cases: list[dict[str, Any]]
    summary: dict[str, float]
    verified: bool
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Headline:
    """One headline number of a benchmark: ``key`` in ``results.summary`` (and results.csv),
    ``label`` as a person reads it, with its unit and the size it refers to (``busbw GB/s @1 MiB``);
    ``better``: ``lower`` or ``higher`` is better ("" = read from the key's unit by the report)."""

    key: str
    label: str
    better: str = ""


@dataclass(frozen=True)
class PageSpec:
    """What a benchmark's current results page shows (``docs/results/<benchmark>_<machine>.md``):
    ``case``, the results.csv columns that name one case (a case measured in several runs is one
    row); ``columns``, the benchmark's own columns after the common ones; ``derive(rows, pool)``
    fills computed columns of the shown rows (``pool``: every row of that machine, for a value
    taken from another case, as T1 at the per-GPU length); ``notes``, sentences that define them;
    ``rows(job)``, a job's results.csv rows in a raw run (one per measured case, from its
    metrics.json dict, ``median_ms``/``iqr_ms``/``iters`` and the ``case`` columns at least);
    ``ways``, case columns that, like ``impl``, name a way of running the same case (the cases
    that differ only in them are compared with each other: ``vs_fastest``); ``absent``, the value
    of a column for the raw runs recorded before it existed (what they measured without saying)."""

    case: tuple[str, ...]
    columns: tuple[str, ...]
    rows: Callable[[dict[str, Any]], list[dict[str, Any]]]
    derive: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None] | None = None
    notes: tuple[str, ...] = ()
    ways: tuple[str, ...] = ()
    absent: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plot:
    """A figure a benchmark contributes to the sweep report."""

    title: str
    figure: "Figure"
    caption: str = ""


class Benchmark(ABC):
    """Subclass, decorate with ``@register("name")`` and add ``conf/benchmark/<name>.yaml``.

    A plugin module imports torch and its engine inside ``run`` (and ``plots`` imports matplotlib
    there): the registry imports every plugin on the driver's path, which must stay light."""

    schema: ClassVar[type[BenchmarkConfig]] = BenchmarkConfig
    # benchmark fields shown in the readable part of the sweep tag (the hash covers all fields);
    # they are also results.csv columns
    tag_keys: ClassVar[tuple[str, ...]] = ()
    # config groups whose option names the tag shows (those that mean something to this benchmark)
    tag_groups: ClassVar[tuple[str, ...]] = ("model", "parallelism", "backend", "mode")
    # launch.keep_ranks's default (null) keeps a rank's process for the sweep's next job only for a
    # benchmark whose medians and peaks were measured the same with kept ranks as with a fresh
    # process per job (docs/running.md names the runs)
    keeps_ranks: ClassVar[bool] = False
    # modules a rank of this benchmark imports in every job beyond the fork server's own
    # (``launch.preload.PRELOAD``): a local sweep's fork server imports them once, before its first
    # job, where each forked rank would import them again
    rank_imports: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def keeps_ranks_for(cls, cfg: DictConfig) -> bool:
        """``keeps_ranks`` for this job's config: a benchmark measured the same kept or fresh only for
        some of its jobs narrows it here."""
        return cls.keeps_ranks

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        """The columns the summary table and the report show for a job of this config."""
        return []

    @classmethod
    def compared(cls, job: dict[str, Any], case: dict[str, Any]) -> bool:
        """Whether a case of a job (its metrics.json dict) measures something to rank, plot and
        compare; one that moves no data (a collective on one rank) is left out of all three."""
        return True

    @classmethod
    def work_per_step(cls, job: dict[str, Any], case: dict[str, Any]) -> tuple[float, str] | None:
        """(work one timed iteration does per GPU, its unit), for a benchmark whose jobs do
        different work per iteration (train: global batches differ between layouts): the ranking
        then ranks by time per unit of work per GPU and shows the rate. None: ranked by time."""
        return None

    @classmethod
    def page(cls) -> PageSpec | None:
        """The columns and derived values of this benchmark's current results pages (None: it has none)."""
        return None

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        """An estimate of the most memory one rank of this job needs (weights, buffers), in bytes,
        checked against the host's or GPU's memory before any rank starts; 0 = no estimate."""
        return 0

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        """Figures for the report from this benchmark's jobs (each a job's metrics.json dict,
        failed ones included). Called by the report engine; never on a rank."""
        return []

    @classmethod
    def report_notes(cls, jobs: list[dict[str, Any]]) -> list[str]:
        """Sentences the report shows under this benchmark's figures (where a baseline of its jobs
        was measured, as attention's T1), from the same jobs as ``plots``."""
        return []

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg.benchmark

    @classmethod
    def world_size(cls, cfg: DictConfig) -> int:
        """Ranks the job needs; the default is the parallelism's world size. A benchmark whose
        rank count depends on ``mode`` (refit, non-collocated) overrides this."""
        p = cfg.parallelism
        return p.tp * p.pp * p.cp * p.dp * p.ep

    @classmethod
    def validate(cls, cfg: DictConfig) -> None:
        """Benchmark-specific cross-field checks; raise ValueError naming the bad value."""

    @abstractmethod
    def run(self) -> BenchmarkResult:
        """Called on every rank inside an initialised process group; rank 0's return counts."""
