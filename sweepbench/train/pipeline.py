"""Pipeline schedules the train engine runs, by name: which stages each pp rank holds, the
torch.distributed.pipelining class that drives them, and the bubble each leaves.

Importing this module does not import torch (the plan's checks use it before any rank starts).

    gpipe                 all forwards, then all backwards; one stage per rank
    1f1b                  one forward, one backward in the steady state; one stage per rank
    interleaved_1f1b      1F1B over v=2 stages per rank, looped (rank r holds r and r+p): the
                          bubble shrinks by v
    interleaved_zb        interleaved with the backward split into input and weight gradients, the
                          weight gradients filling the bubble (zero bubble, ZB-H1 style)
    zbv                   zero bubble over two stages per rank laid out as a V (rank r holds r and
                          2p-1-r, so rank 0 holds the first and the last stage)

The zero-bubble schedules split each backward in two, which torch does not support through a
compiled block nor through a block under selective activation checkpointing (full checkpointing
works): they are refused with ``benchmark.compile=true`` and with ``benchmark.ac=selective``."""

from __future__ import annotations

from dataclasses import dataclass

from sweepbench.core import Registry


@dataclass(frozen=True)
class ScheduleSpec:
    cls_name: str  # in torch.distributed.pipelining.schedules
    stages_per_rank: int
    style: str = "loop"  # how stages map to ranks: loop (r, r+p, ...) | v (r, 2p-1-r)
    compiles: bool = True  # runs with compiled blocks
    runtime: bool = False  # torch's runtime schedule: takes a list of stages, plans each rank's time slots
    zero_bubble: bool = False  # splits backward into input and weight gradients (no closed-form bubble)


SCHEDULES: Registry[ScheduleSpec] = Registry("pipeline schedule", ordered=True)
SCHEDULES.add("gpipe", ScheduleSpec("ScheduleGPipe", 1))
SCHEDULES.add("1f1b", ScheduleSpec("Schedule1F1B", 1))
SCHEDULES.add("interleaved_1f1b", ScheduleSpec("ScheduleInterleaved1F1B", 2, runtime=True))
SCHEDULES.add(
    "interleaved_zb", ScheduleSpec("ScheduleInterleavedZeroBubble", 2, compiles=False, runtime=True, zero_bubble=True)
)
SCHEDULES.add(
    "zbv", ScheduleSpec("ScheduleZBVZeroBubble", 2, style="v", compiles=False, runtime=True, zero_bubble=True)
)


def schedule_names() -> tuple[str, ...]:
    return SCHEDULES.names()


def schedule_spec(name: str) -> ScheduleSpec:
    return SCHEDULES.get(name, key="benchmark.pp_schedule")


def stage_layers(sid: int, *, num_layers: int, num_stages: int) -> range:
    """The layers pipeline stage ``sid`` holds: equal runs of layers, in order (the embedding goes
    with the first stage, the norm and output projection with the last)."""
    per_stage = num_layers // num_stages
    return range(sid * per_stage, (sid + 1) * per_stage)


def stage_ids(name: str, *, pp_rank: int, pp: int) -> list[int]:
    """The pipeline stages (in model order) that pp rank ``pp_rank`` holds."""
    spec = schedule_spec(name)
    if spec.style == "v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(spec.stages_per_rank)]


def analytic_bubble(name: str, *, pp: int, num_micro: int) -> float | None:
    """The idle share of a step whose stages take equal times: (p-1)/(m+p-1) for gpipe and 1f1b,
    (p-1)/(v·m+p-1) for v interleaved stages per rank (Narayanan et al.); None for the
    zero-bubble schedules, whose bubble depends on how forward, input- and weight-gradient
    times compare (their plan's slot count stands for it)."""
    spec = schedule_spec(name)
    if spec.zero_bubble:
        return None
    return (pp - 1) / (spec.stages_per_rank * num_micro + pp - 1) if pp > 1 else 0.0


def pipeline_bubble(schedule: object | None, name: str, *, pp: int, num_micro: int) -> dict[str, float | None]:
    """A step's idle share as a train implementation reports it (``pp_bubble``): by formula
    (``analytic``; the plan's where the schedule has no formula), and by the runtime schedule's own
    plan where it has one (gpipe and 1f1b keep an order of actions, not a plan in time slots);
    none without a pipeline (``schedule`` None)."""
    if schedule is None:
        return {"analytic": 0.0, "schedule": None}
    planned = schedule_bubble(schedule) if schedule_spec(name).runtime else None
    formula = analytic_bubble(name, pp=pp, num_micro=num_micro)
    return {"analytic": planned if formula is None else formula, "schedule": planned}


def schedule_bubble(schedule: object) -> float | None:
    """The bubble of a runtime schedule's own plan (``pipeline_order``: each rank's actions in
    time slots, None where it idles): a step lasts as many slots as the longest rank's plan, and
    the bubble is the mean share of those slots a rank is idle, each action counted as one slot."""
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        return None
    busy = [sum(a is not None for a in actions) for actions in order.values()]
    span = max(max((i + 1 for i, a in enumerate(actions) if a is not None), default=0) for actions in order.values())
    return sum(span - b for b in busy) / (len(busy) * span) if span else None
