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
dying backend is survived.

A child's start (the interpreter, torch's import, the CUDA context, each backend's first call:
seconds, every job) is paid ahead where ``spare`` (``benchmark.t1_spare``): as T1's first child
starts, a spare child is started beside it, which imports while the job goes on and touches no
device; at the job's end, after its numbers are taken, ``warm_spare`` has it open the device and
run each backend once at a tiny size, and the next job of the process (a kept rank's) hands it
its case. A spare that no case
reaches within ``SPARE_WAIT_S`` of warming, or whose job found T1 in the store, exits: it never
holds a device through another job's timing. The reference (out and gradients of T1's fastest
backend) is computed by rank 0, which needs it on its device anyway; its copy for the store is
written by a thread while the job goes on (``finish_saves`` waits for it at the job's end)."""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch

    from sweepbench.measure.store import Store

PREFIX = "t1-probe "
FAULT = "fault"
SPARE_WAIT_S = 60.0  # a warmed spare that no case reaches within this leaves (its device context with it)
WARM_TOKENS = 256  # the sequence of the spare's warm-up calls

_spare: "subprocess.Popen[str] | None" = None  # this process's spare child, if any
_saves: list[threading.Thread] = []  # references being written for the store


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
    cuda_graph: bool = False  # fwd and bwd replayed from CUDA graphs (graphs.py), as the ranks' are


def _why_died(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _start_child() -> "subprocess.Popen[str]":
    """A child that imports torch and waits for its case on stdin (its stderr joins its stdout:
    the parent passes those lines on to its own log, that of the job the child serves)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sweepbench.attention.t1", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def keep_spare() -> None:
    """Start this process's spare child if it has none (it imports now, touches no device)."""
    global _spare
    if _spare is None or _spare.poll() is not None:
        _spare = _start_child()


def warm_spare(case: T1Case, candidates: list[str], *, wait_s: float = SPARE_WAIT_S) -> None:
    """Have the spare open ``case``'s device and run each of ``candidates`` once at a tiny size of
    ``case``'s heads and dtype (their kernels' set-up), then wait ``wait_s`` for its case."""
    global _spare
    if _spare is None or _spare.poll() is not None or _spare.stdin is None:
        return
    try:
        _spare.stdin.write(json.dumps({"warm": asdict(case), "candidates": candidates, "wait_s": wait_s}) + "\n")
        _spare.stdin.flush()
    except OSError:  # it died: the next T1 starts a fresh child
        _spare = None


def drop_spare() -> None:
    """End the spare (a job that found T1 in the store: it must not hold a device through the timing)."""
    global _spare
    proc, _spare = _spare, None
    if proc is None:
        return
    if proc.stdin:
        try:
            proc.stdin.close()  # it leaves at end of input
        except OSError:
            pass
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _take_child() -> tuple["subprocess.Popen[str]", bool]:
    """The spare if one is alive (True), else a fresh child (False)."""
    global _spare
    proc, _spare = _spare, None
    if proc is not None and proc.poll() is None:
        return proc, True
    return _start_child(), False


def _ask(proc: "subprocess.Popen[str]", spec: str) -> str:
    """Hand ``proc`` its case; its output until it exits."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(spec + "\n")
        proc.stdin.close()
    except OSError:  # it died before (a spare whose warm-up failed): its output says why
        pass
    out = proc.stdout.read()
    proc.stdout.close()
    proc.wait()
    return out


def probe_backends(
    case: T1Case,
    candidates: list[str],
    *,
    fault: str = "",
    spent: dict[str, float] | None = None,
    spare: bool = False,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """({backend: per-iteration seconds} of the backends that ran, {backend: why not} of the
    others). ``spent`` gets where the children's wall time went: ``child_start`` (from the case
    handed over to the inputs made: interpreter, imports, CUDA, inputs; every child's; where the
    first was a spare, ``spare_start`` is its part), ``first_call_<backend>`` (each backend's probe,
    its first call). With ``spare`` the first child is the spare where one is alive, and a new
    spare is started beside it."""
    todo = ([FAULT] if fault else []) + list(candidates)
    times: dict[str, list[float]] = {}
    refused: dict[str, str] = {}
    spent = {} if spent is None else spent
    first = True
    while todo:
        spec = json.dumps({"case": asdict(case), "backends": todo, "fault": fault})
        proc, was_spare = _take_child() if spare and first else (_start_child(), False)
        if spare and first:
            keep_spare()  # the next job's child imports while this one probes (on the host only)
        first = False
        asked = time.time()
        current: str | None = None
        for line in _ask(proc, spec).splitlines():
            if not line.startswith(PREFIX):
                print(line, file=sys.stderr, flush=True)  # the child's own output, in this job's log
                continue
            kind, name, value = json.loads(line[len(PREFIX) :])
            if kind == "ready":  # the child's wall clock when it could start probing
                start = max(value - asked, 0.0)
                spent["child_start"] = spent.get("child_start", 0.0) + start
                if was_spare:
                    spent["spare_start"] = start
                continue
            if kind == "first":
                spent[f"first_call_{name}"] = value
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
        elif todo and proc.returncode != 0 and not was_spare:  # it died before trying any: so would the next
            refused.update({n: f"the probe process failed ({_why_died(proc.returncode)})" for n in todo})
            todo = []
    for name, why in refused.items():
        print(f"attention: SDPA backend {name} cannot run this case: {why}", flush=True)
    return times, refused


def t1_and_reference(
    rank: int,
    inputs: list["torch.Tensor"],
    case: T1Case,
    *,
    candidates: list[str],
    fault: str,
    store: "Store | None",
    prune_factor: float = 0.0,
    spare: bool = False,
) -> tuple[dict[str, Any], list["torch.Tensor"] | None, dict[str, Any]]:
    """T1 ({"stats": {backend: stats}, "refused": {backend: why}, "pruned": {backend: why},
    "times_s": {backend: samples}}, on every rank), the reference (out, dq, dk, dv) of T1's fastest
    backend (rank 0; None elsewhere) and where they came from ({"reused": whether both came from
    the store, "measured": where and when they were measured, None without a store}). A backend
    that lost clearly at a shorter length of the same shape (``t1_store.prune``, ``prune_factor``)
    is not timed. No backend left fails the job. ``spare``: children as ``probe_backends``'s; a
    spare is ended where T1 came from the store."""
    import torch

    from sweepbench.attention.t1_store import prune, t1_entry

    t1: dict[str, Any] | None = None
    reference: list[torch.Tensor] | None = None
    source: dict[str, Any] = {"reused": False, "measured": None}
    measured: dict[str, Any] | None = None
    if rank == 0:
        device = inputs[0].device
        key = _t1_key(case, candidates, fault, device)
        with t1_entry(store, key) as entry:
            t1 = entry.t1() if entry else None
            q, k, v, _ = inputs  # the reference: out and dq shaped as q, dk and dv as k and v
            reference = entry.reference(device, like=[q, q, k, v] if case.backward else [q]) if entry and t1 else None
            reused = reference is not None
            if reused:
                drop_spare()
            else:
                with t1_entry(store, _ranking_key(key)) as ranking:
                    pruned = prune(
                        ranking.value("lengths") if ranking else None,
                        seq_len=case.seq_len,
                        candidates=candidates,
                        factor=prune_factor,
                    )
                measured = store.stamp() if store else None
                t1, reference = _measure(
                    inputs,
                    case,
                    candidates=[c for c in candidates if c not in pruned],
                    fault=fault,
                    pruned=pruned,
                    spare=spare,
                )
                if store and reference is not None:
                    _save_later(store, key, t1, reference, measured, t1["phase_s"])
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
            source = {"reused": reused, "measured": entry.measured if reused and entry else measured}
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
        # cuda_graph only where set: the eager cases keep the keys they were stored under
        **{k: v for k, v in asdict(case).items() if k not in ("device", "num_threads") and (k != "cuda_graph" or v)},
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
    spare: bool = False,
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
                    times, _ = probe_backends(local, [backend], spare=spare)
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
    pruned: dict[str, str],
    spare: bool,
) -> tuple[dict[str, Any], list["torch.Tensor"] | None]:
    """T1 measured in children and the reference of its fastest backend, computed here (rank 0's
    device holds it for the verification)."""
    import torch

    from sweepbench.attention.dilated import Branch
    from sweepbench.measure import summarize

    device = inputs[0].device
    spent: dict[str, float] = {}
    tic = time.perf_counter()
    times, refused = probe_backends(case, candidates, fault=fault, spent=spent, spare=spare)
    if not times and pruned:  # those left refused this length: the pruned ones may still run it
        times, more = probe_backends(case, list(pruned), spent=spent, spare=spare)
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
    return t1, reference


def _save_later(
    store: "Store",
    key: dict[str, Any],
    t1: dict[str, Any],
    reference: list["torch.Tensor"],
    measured: dict[str, Any] | None,
    spent: dict[str, float],
) -> None:
    """The reference copied to the host now (``spent["reference_copy"]``: before the job's timing,
    which it would otherwise share the device's memory with) and written for the store, with T1,
    by a thread while the job goes on; ``finish_saves`` waits for it."""
    from sweepbench.attention.t1_store import t1_entry

    tic = time.perf_counter()
    host = [_to_host(x.detach()) for x in reference]
    spent["reference_copy"] = time.perf_counter() - tic
    stored = dict(t1, phase_s=dict(spent))

    def write() -> None:
        try:
            with t1_entry(store, key) as entry:
                assert entry is not None  # a store was given
                entry.save(stored, host, measured=measured)
        except Exception as err:  # noqa: BLE001 - a full disk, a store gone: the job's numbers stand, a later job measures again
            print(
                f"sweepbench: T1's reference not stored ({type(err).__name__}: {err}); a later job measures it again",
                flush=True,
            )

    thread = threading.Thread(target=write, name="t1-reference-save", daemon=True)
    thread.start()
    _saves.append(thread)


def _to_host(x: "torch.Tensor") -> "torch.Tensor":
    """``x`` on the host: into memory whose pages are first touched by torch's threads together
    (a single copy into fresh pageable memory faults them in one by one: 1.4 GB/s measured on
    an H200 host)."""
    import torch

    if x.device.type == "cpu":
        return x
    host = torch.empty(x.shape, dtype=x.dtype)
    host.zero_()
    return host.copy_(x)


def finish_saves() -> float:
    """Wait for the references being written for the store; the seconds waited."""
    tic = time.perf_counter()
    while _saves:
        _saves.pop(0).join()
    return time.perf_counter() - tic


def _fwd_bwd(
    leaves: list["torch.Tensor"],
    dout: "torch.Tensor",
    *,
    backend: str,
    case: T1Case,
    branches: tuple,
    graphs: dict[str, Any] | None = None,
) -> list["torch.Tensor"]:
    """The whole sequence on one device with ``backend``: the forward (and, where the case has one,
    the backward into ``leaves``, their old gradients cleared first); [out, dq, dk, dv] or [out].
    With ``graphs`` (``case.cuda_graph``) both are replayed from CUDA graphs, captured at the
    backend's first call and kept there (the returned tensors are then the graphs' memory)."""
    from sweepbench.attention.graphs import graphed
    from sweepbench.attention.scaling import single_device

    def call(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor") -> "torch.Tensor":
        return single_device(q, k, v, backend=backend, causal=case.causal, pattern=case.pattern, branches=branches)

    if graphs is not None and backend not in graphs:
        graphs[backend] = graphed(call, leaves)
    for x in leaves:
        x.grad = None
    out = graphs[backend]() if graphs is not None else call(*leaves)
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


def _read_line(timeout: float | None) -> str | None:
    """A line of stdin ("" at its end), or None when none came within ``timeout`` seconds."""
    data = b""
    while not data.endswith(b"\n"):
        if timeout is not None and not select.select([0], [], [], timeout)[0]:
            return None
        chunk = os.read(0, 1)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _warm(spec: dict[str, Any], candidates: list[str]) -> None:
    """Open the device and run each backend once at ``WARM_TOKENS`` tokens of the case's heads and
    dtype: what a child's first calls cost, paid before its case comes."""
    import torch

    from sweepbench.attention.scaling import Shape, make_inputs

    c = replace(T1Case(**spec), seq_len=WARM_TOKENS, pattern="dense", branches=[])
    device = torch.device(c.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    q, k, v, dout = make_inputs(
        Shape(c.batch, c.heads, c.kv_heads, c.seq_len, c.head_dim), dtype=getattr(torch, c.dtype), device=device, seed=0
    )
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    for name in candidates:
        _fwd_bwd(leaves, dout, backend=name, case=c, branches=())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        del q, k, v, dout, leaves
        torch.cuda.empty_cache()


def _serve(parent: int) -> None:
    """A child: imports, then reads its case from stdin (a spare may first be told to warm up)."""
    _die_with_parent(parent)
    import torch  # noqa: F401 - the import a spare pays ahead
    import torch.distributed  # noqa: F401

    import sweepbench.attention.scaling  # noqa: F401
    import sweepbench.measure  # noqa: F401

    timeout = None
    while True:
        line = _read_line(timeout)
        if not line:  # end of input (the spare was dropped), or no case within SPARE_WAIT_S of warming
            return
        msg = json.loads(line)
        if "warm" not in msg:
            _child(msg)
            return
        try:
            _warm(msg["warm"], msg["candidates"])
        except Exception:  # noqa: BLE001 - a backend that fails even at a tiny size: a fresh child tries it with its case
            os._exit(1)
        timeout = float(msg["wait_s"])


def _child(spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from sweepbench.attention.dilated import Branch
    from sweepbench.attention.scaling import Shape, make_inputs
    from sweepbench.measure import time_iterations

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
    graphs: dict[str, Any] = {}  # the backend's replay (c.cuda_graph), captured at its probe
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _say("ready", "", time.time())
    for name in spec["backends"]:
        _say("start", name, None)

        def run() -> None:
            if name == FAULT:
                _do_fault(spec["fault"])
            _fwd_bwd(leaves, dout, backend=name, case=c, branches=branches, graphs=graphs if c.cuda_graph else None)

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
        graphs.clear()  # this backend's graphs and their memory
        _say("ok", name, times)
    dist.destroy_process_group()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
