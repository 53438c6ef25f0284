"""T1: the whole sequence on one device, timed with every SDPA backend that runs it, each backend
probed and timed in a child process of rank 0 (a fresh interpreter, ``python -m
sweepbench.attention.t1``), so that a backend that kills its process or poisons the CUDA
context (``an illegal memory access``) is left out with its reason and the job goes on.

The child rebuilds the inputs from the seed (``make_inputs``: the same values as the ranks'),
runs each backend once (the probe, which is also its warm-up: its first call, kernel set-up
included, is reported), then times ``iters`` iterations with the benchmark's timing loop (a
process group of one). It reports one JSON line per event on
stdout; after a backend fails it exits (its CUDA context may be poisoned) and the parent starts a
fresh child for the backends left. ``fault`` (``benchmark.t1_fault``) adds a first candidate named
``fault`` whose probe does that to its process (exit, kill, raise, segfault): the check that a
dying backend is survived."""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch

    from sweepbench.attention.t1_store import T1Entry
    from sweepbench.measure.store import Store

PREFIX = "t1-probe "
FAULT = "fault"


@dataclass(frozen=True)
class T1Case:
    """What the child needs to rebuild the inputs and run the whole sequence on one device."""

    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    dtype: str
    device: str  # "cpu" or "cuda:N"
    seed: int
    causal: bool
    backward: bool
    pattern: str
    branches: list[list[int]]  # (segment, rate) of each dilated branch
    iters: int
    num_threads: int


def _why_died(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def probe_backends(
    case: T1Case,
    candidates: list[str],
    *,
    fault: str = "",
    spent: dict[str, float] | None = None,
    reference_to: Path | None = None,
) -> tuple[dict[str, list[float]], dict[str, str], str | None]:
    """({backend: per-iteration seconds} of the backends that ran, {backend: why not} of the others,
    the backend whose reference the last child wrote to ``reference_to``, if any). ``spent`` gets
    where the children's wall time went: ``child_start`` (interpreter, imports, CUDA, inputs; every
    child's), ``first_call_<backend>`` (each backend's probe, its first call), ``child_reference``
    (the reference computed and written)."""
    todo = ([FAULT] if fault else []) + list(candidates)
    times: dict[str, list[float]] = {}
    refused: dict[str, str] = {}
    spent = {} if spent is None else spent
    made = None
    while todo:
        spec = json.dumps(
            {
                "case": asdict(case),
                "backends": todo,
                "fault": fault,
                "parent": os.getpid(),
                "reference_to": str(reference_to) if reference_to else None,
            }
        )
        spawned = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "sweepbench.attention.t1"],
            input=spec,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        current: str | None = None
        for line in proc.stdout.splitlines():
            if not line.startswith(PREFIX):
                continue
            kind, name, value = json.loads(line[len(PREFIX) :])
            if kind == "ready":  # the child's wall clock when it could start probing
                spent["child_start"] = spent.get("child_start", 0.0) + max(value - spawned, 0.0)
                continue
            if kind == "first":
                spent[f"first_call_{name}"] = value
                continue
            if kind == "reference":
                made, spent["child_reference"] = name, value
                continue
            if kind == "start":
                current = name
                continue
            current = None
            todo.remove(name)
            if kind == "ok":
                times[name] = value
            else:
                refused[name] = value
        if current is not None:  # it died while running this backend
            refused[current] = f"its probe process died ({_why_died(proc.returncode)})"
            todo.remove(current)
        elif todo and proc.returncode != 0:  # it died before trying any: nothing would go better next time
            refused.update({n: f"the probe process failed ({_why_died(proc.returncode)})" for n in todo})
            todo = []
    for name, why in refused.items():
        print(f"attention: SDPA backend {name} cannot run this case: {why}", flush=True)
    return times, refused, made


def t1_and_reference(
    rank: int,
    inputs: list["torch.Tensor"],
    case: T1Case,
    *,
    candidates: list[str],
    fault: str,
    store: "Store | None",
    prune_factor: float = 0.0,
) -> tuple[dict[str, Any], list["torch.Tensor"] | None, dict[str, Any]]:
    """T1 ({"stats": {backend: stats}, "refused": {backend: why}, "pruned": {backend: why},
    "times_s": {backend: samples}}, on every rank), the reference (out, dq, dk, dv) of T1's fastest
    backend (rank 0; None elsewhere) and where they came from ({"reused": whether both came from
    the store, "measured": where and when they were measured, None without a store}). A backend
    that lost clearly at a shorter length of the same shape (``t1_store.prune``, ``prune_factor``)
    is not timed. No backend left fails the job."""
    import torch

    from sweepbench.attention.t1_store import prune, t1_entry

    t1: dict[str, Any] | None = None
    reference: list[torch.Tensor] | None = None
    source: dict[str, Any] = {"reused": False, "measured": None}
    if rank == 0:
        device = inputs[0].device
        key = _t1_key(case, candidates, fault, device)
        with t1_entry(store, key) as entry:
            t1 = entry.t1() if entry else None
            q, k, v, _ = inputs  # the reference: out and dq shaped as q, dk and dv as k and v
            reference = entry.reference(device, like=[q, q, k, v] if case.backward else [q]) if entry and t1 else None
            reused = reference is not None
            if not reused:
                with t1_entry(store, _ranking_key(key)) as ranking:
                    pruned = prune(
                        ranking.value("lengths") if ranking else None,
                        seq_len=case.seq_len,
                        candidates=candidates,
                        factor=prune_factor,
                    )
                t1, reference = _measure(
                    inputs,
                    case,
                    candidates=[c for c in candidates if c not in pruned],
                    fault=fault,
                    entry=entry,
                    pruned=pruned,
                )
                if ranking is not None:
                    with t1_entry(store, _ranking_key(key)) as ranking:
                        assert ranking is not None  # the store that gave it the first time
                        lengths = ranking.value("lengths")
                        lengths = dict(lengths) if isinstance(lengths, dict) else {}
                        lengths[str(case.seq_len)] = {
                            **{b: {k: s[k] for k in ("median_s", "min_s", "max_s")} for b, s in t1["stats"].items()},
                            **{b: {"pruned": why} for b, why in t1["pruned"].items()},
                        }  # stays out further on
                        ranking.put("lengths", lengths)
            source = {"reused": reused, "measured": entry.measured if entry else None}
    box = [(t1, source)]
    torch.distributed.broadcast_object_list(box, src=0)
    t1, source = box[0]
    assert t1 is not None  # rank 0's, measured or reused
    if not t1["stats"]:
        raise RuntimeError(
            f"the whole sequence does not run on one device with any SDPA backend, so there is "
            f"no T1 and no reference: {t1['refused']}"
        )
    return t1, reference, source


def _t1_key(case: T1Case, candidates: list[str], fault: str, device: "torch.device") -> dict[str, Any]:
    """What T1 and the reference of ``case`` depend on: the store files them by it."""
    from sweepbench.attention.t1_store import software_key

    return {
        **{k: v for k, v in asdict(case).items() if k not in ("device", "num_threads")},
        "candidates": candidates,
        "fault": fault,
        **software_key(device),
    }


def _ranking_key(key: dict[str, Any]) -> dict[str, Any]:
    """The shape's ranking of the backends by length: T1's key without the length."""
    return {**{k: v for k, v in key.items() if k != "seq_len"}, "ranking": True}


def t1_local(
    rank: int,
    case: T1Case,
    *,
    world_size: int,
    backend: str,
    candidates: list[str],
    fault: str,
    device: "torch.device",
    store: "Store | None",
) -> float | None:
    """T1 at the per-GPU length (median seconds of one device at ``seq_len // world_size`` with
    ``backend``; on every rank), the base of ``efficiency_local``: from the store where a job
    measured that length (its T1, or this value), else measured in a child as T1 is and stored.
    None at W=1, for a dilated pattern (its segments are sized for the whole length) and where the
    backend refuses the shorter sequence."""
    import torch

    from sweepbench.attention.t1_store import t1_entry
    from sweepbench.measure import summarize

    if world_size == 1 or case.pattern != "dense" or case.seq_len % world_size:
        return None
    box: list[float | None] = [None]
    if rank == 0:
        local = replace(case, seq_len=case.seq_len // world_size)
        key = _t1_key(local, candidates, fault, device)
        with t1_entry(store, key) as entry:  # a job at that length
            t1 = entry.t1() if entry else None
            box = [t1["stats"][backend]["median_s"] if t1 and backend in t1["stats"] else None]
        if box[0] is None:
            with t1_entry(store, {**key, "t1_local": backend}) as entry:
                value = entry.value("t1_local_s") if entry else None
                box = [float(value) if isinstance(value, (int, float)) else None]
                if box[0] is None:
                    times, _, _ = probe_backends(local, [backend])
                    box = [summarize(times[backend])["median_s"] if backend in times else None]
                    if entry and box[0] is not None:
                        entry.put("t1_local_s", box[0])
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _measure(
    inputs: list["torch.Tensor"],
    case: T1Case,
    *,
    candidates: list[str],
    fault: str,
    entry: "T1Entry | None",
    pruned: dict[str, str],
) -> tuple[dict[str, Any], list["torch.Tensor"] | None]:
    """T1 measured in children and the reference of its fastest backend. With a store entry the
    last child, where that backend has just run, computes the reference and writes it for the entry
    (read back here); otherwise, or if the child's backend is not the fastest, rank 0 computes it
    (its first call of that backend at the whole sequence: seconds with cuDNN) and stores it."""
    import torch

    from sweepbench.attention.dilated import Branch
    from sweepbench.measure import summarize

    device = inputs[0].device
    spent: dict[str, float] = {}
    tmp = entry.reference_tmp() if entry else None
    try:
        tic = time.perf_counter()
        times, refused, made = probe_backends(case, candidates, fault=fault, spent=spent, reference_to=tmp)
        if not times and pruned:  # those left refused this length: the pruned ones may still run it
            times, more, made = probe_backends(case, list(pruned), spent=spent, reference_to=tmp)
            refused, pruned = {**refused, **more}, {}
        spent["children"] = time.perf_counter() - tic
        t1 = {
            "stats": {n: summarize(t) for n, t in times.items()},
            "refused": refused,
            "pruned": pruned,
            "times_s": times,
            "phase_s": spent,
        }
        if not times:
            return t1, None
        best = min(times, key=lambda n: t1["stats"][n]["median_s"])
        if entry and tmp and made == best:  # the child's: stored, then read back as a later job would
            tic = time.perf_counter()
            entry.commit(t1, tmp)
            tmp = None
            reference = entry.reference(device)
            spent["reference_load"] = time.perf_counter() - tic
            if reference is not None:
                return t1, reference
        tic = time.perf_counter()
        reference = _fwd_bwd(
            [x.detach().clone().requires_grad_() for x in inputs[:3]],
            inputs[3],
            backend=best,
            case=case,
            branches=tuple(Branch(s, r) for s, r in case.branches),
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        spent["reference"] = time.perf_counter() - tic
        if entry:
            tic = time.perf_counter()
            entry.save(t1, reference)
            spent["reference_save"] = time.perf_counter() - tic
        return t1, reference
    finally:
        if tmp:
            tmp.unlink(missing_ok=True)


def _fwd_bwd(
    leaves: list["torch.Tensor"], dout: "torch.Tensor", *, backend: str, case: T1Case, branches: tuple
) -> list["torch.Tensor"]:
    """The whole sequence on one device with ``backend``: the forward (and, where the case has one,
    the backward into ``leaves``, their old gradients cleared first); [out, dq, dk, dv] or [out]."""
    from sweepbench.attention.scaling import single_device

    for x in leaves:
        x.grad = None
    out = single_device(*leaves, backend=backend, causal=case.causal, pattern=case.pattern, branches=branches)
    if case.backward:
        out.backward(dout)
    grads = (cast("torch.Tensor", x.grad) for x in leaves)  # set by the backward
    return [out.detach(), *grads] if case.backward else [out.detach()]


def _say(kind: str, name: str, value: Any) -> None:
    print(PREFIX + json.dumps([kind, name, value]), flush=True)


def _do_fault(kind: str) -> None:
    if kind == "exit":
        os._exit(3)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        ctypes.string_at(0)
    raise RuntimeError(f"injected fault: benchmark.t1_fault={kind}")


def _die_with_parent(parent: int) -> None:
    """SIGKILL this child when its rank dies (the launcher SIGKILLs ranks on a failure or time-out)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _child(spec: dict[str, Any]) -> None:
    _die_with_parent(spec["parent"])
    import torch
    import torch.distributed as dist

    from sweepbench.attention.dilated import Branch
    from sweepbench.attention.scaling import Shape, make_inputs
    from sweepbench.measure import summarize, time_iterations

    c = T1Case(**spec["case"])
    torch.set_num_threads(c.num_threads)
    device = torch.device(c.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # the timing loop's group
    q, k, v, dout = make_inputs(
        Shape(c.batch, c.heads, c.kv_heads, c.seq_len, c.head_dim),
        dtype=getattr(torch, c.dtype),
        device=device,
        seed=c.seed,
    )
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    branches = tuple(Branch(s, r) for s, r in c.branches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _say("ready", "", time.time())
    timed: dict[str, float] = {}  # backend -> median seconds, of those this child timed
    for name in spec["backends"]:
        _say("start", name, None)

        def run() -> None:
            if name == FAULT:
                _do_fault(spec["fault"])
            _fwd_bwd(leaves, dout, backend=name, case=c, branches=branches)

        try:
            tic = time.perf_counter()
            run()  # the probe, and the warm-up of the timing
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            _say("first", name, time.perf_counter() - tic)
            times = time_iterations(run, warmup=0, iters=c.iters, device=device)
            assert all(math.isfinite(t) and t > 0 for t in times), times
        except Exception as err:  # noqa: BLE001 - a backend that refuses this case (or runs out of memory)
            _say("refused", name, str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
            return  # a failed CUDA call may have poisoned the context: a fresh child tries the rest
        _say("ok", name, times)
        timed[name] = summarize(times)["median_s"]  # as the parent ranks them
    if spec.get("reference_to") and timed:  # the reference of this child's fastest backend, while it is warm
        best = min(timed, key=timed.__getitem__)
        tic = time.perf_counter()
        got = _fwd_bwd(leaves, dout, backend=best, case=c, branches=branches)
        with open(spec["reference_to"], "wb") as f:
            torch.save([x.cpu() for x in got], f)
        _say("reference", best, time.perf_counter() - tic)
    dist.destroy_process_group()


if __name__ == "__main__":
    _child(json.loads(sys.stdin.read()))
