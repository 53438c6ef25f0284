"""The ``nccl_tests`` implementation of the collective benchmark: NVIDIA's nccl-tests binaries, from a
build the user points to (``benchmark.nccl_tests_dir``; bench/peers/build_nccl_tests.sh makes one).

nccl-tests is built without MPI (``make MPI=0``) and run as people run it on one node: one
process drives every GPU (``-g <world size>``). Rank 0 of the job starts it, once per op over all
sizes, while the other ranks wait on a CPU (gloo) barrier, so nothing of theirs runs on the GPUs.
The binary gets the job's sizes (``-b -e -f``), dtype, warm-up (``-w``), ops per sample (``-n``)
and samples (``-N``: each cycle prints one line per size) and checks every result (``-c 1``: its
``#wrong`` column must be 0). Of the out-of-place and in-place columns, the out-of-place ones are
kept (sweepbench's torch implementation is out-of-place for every op but all_reduce).

``nccl_tests_graph`` runs the same binaries with ``-G 1``: each sample's ``-n`` calls are captured
once as a CUDA graph and the graph launched once, timed by the same host timer: nccl-tests' own
form of what ``torch_graph`` times, so that each pair compares the same way of calling."""

from __future__ import annotations

import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

BINARIES = {
    "all_reduce": "all_reduce_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "broadcast": "broadcast_perf",
    "all_to_all": "alltoall_perf",
    "send_recv": "sendrecv_perf",
}
NCCL_DTYPES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
PR_SET_PDEATHSIG = 1  # linux/prctl.h
MAX_OUTPUT_BYTES = 16 << 20  # nccl-tests prints a few KiB; a binary printing more is not it
BUILD_HINT = "build one with: bench/peers/build_nccl_tests.sh <nccl-tests source dir>"


def check_build(cfg: Any, world_size: int) -> None:
    """ValueError (one line) unless ``benchmark.nccl_tests_dir`` holds an executable nccl-tests
    binary for each of the job's ops and the job can run as one process on one GPU node."""
    from sweepbench.config.validate import GPU_BACKENDS, resolve_backend
    from sweepbench.core import NotOnThisMachine

    b = cfg.benchmark
    wanted = ", ".join(BINARIES[op] for op in b.ops)
    if not b.nccl_tests_dir:
        raise ValueError(
            f"benchmark.impl=nccl_tests needs benchmark.nccl_tests_dir=<nccl-tests build directory "
            f"holding {wanted}>; {BUILD_HINT}"
        )
    where = Path(b.nccl_tests_dir).expanduser()
    if not where.is_dir():
        raise ValueError(
            f"benchmark.nccl_tests_dir={b.nccl_tests_dir} is not a directory; expected an nccl-tests "
            f"build directory holding {wanted}; {BUILD_HINT}"
        )
    missing = [BINARIES[op] for op in b.ops if not os.access(where / BINARIES[op], os.X_OK)]
    if missing:
        raise ValueError(
            f"benchmark.nccl_tests_dir={b.nccl_tests_dir} lacks {', '.join(missing)}; expected an "
            f"nccl-tests build directory holding {wanted}; {BUILD_HINT}"
        )
    if resolve_backend(cfg.backend.name) not in GPU_BACKENDS:  # on auto: this machine has no GPU
        raise (NotOnThisMachine if cfg.backend.name == "auto" else ValueError)(
            f"benchmark.impl=nccl_tests runs on GPUs, not backend={cfg.backend.name}; "
            "use backend=nccl (or auto on a GPU machine)"
        )
    if cfg.launch.ranks_per_node not in (0, world_size):
        raise ValueError(
            f"benchmark.impl=nccl_tests runs on one node (one process, -g {world_size}); "
            f"launch.ranks_per_node={cfg.launch.ranks_per_node} splits the job: use 0 or {world_size}"
        )


def command(binary: Path, *, world_size: int, cfg: Any, ops_per_sample: int, graph: bool = False) -> list[str]:
    """The nccl-tests command line for the job's sizes, dtype, warm-up, samples and ops per sample;
    with ``graph``, ``-G 1``: the ``-n`` calls of a sample captured as one CUDA graph, launched once."""
    return [
        str(binary),
        "-g",
        str(world_size),
        "-b",
        str(cfg.min_bytes),
        "-e",
        str(cfg.max_bytes),
        "-f",
        str(cfg.step_factor),
        "-d",
        NCCL_DTYPES[cfg.dtype],
        "-w",
        str(cfg.warmup),
        "-n",
        str(ops_per_sample),
        "-N",
        str(cfg.iters),
        "-c",
        "1",
        *(["-G", "1"] if graph else []),
    ]


@dataclass(frozen=True)
class Row:
    """One result line of nccl-tests, out-of-place columns."""

    size_bytes: int  # nccl-tests' S: max(send, receive) bytes of one rank
    count: int  # elements
    dtype: str
    time_us: float  # per op, averaged over -n back-to-back ops
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None when the run did not check (-c 0 prints N/A)


def parse_output(text: str) -> list[Row]:
    """The result lines of nccl-tests' stdout, in order (one per size and cycle). A result line is
    ``size count type redop root`` then, for out-of-place and in-place each, ``time algbw busbw
    #wrong`` (with -I 1, four per-iteration columns follow each group); comments start with #."""
    rows = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 13 or not (tok[0].isdigit() and tok[1].isdigit()):
            continue
        try:
            row = Row(
                size_bytes=int(tok[0]),
                count=int(tok[1]),
                dtype=tok[2],
                time_us=float(tok[5]),
                algbw_gbps=float(tok[6]),
                busbw_gbps=float(tok[7]),
                wrong=None if tok[8] == "N/A" else int(float(tok[8])),
            )
        except (ValueError, OverflowError):  # not a result line after all: counted missing below
            continue
        if math.isfinite(row.time_us) and row.time_us > 0:
            rows.append(row)
    return rows


def header(text: str) -> dict[str, str]:
    """nccl-tests' version line and the run's parameters line, as printed."""
    keep = {"# nccl-tests version": "version", "# nThread": "parameters"}
    return {
        name: line[2:].strip() for line in text.splitlines() for start, name in keep.items() if line.startswith(start)
    }


def cases_from_rows(
    op: str,
    rows: list[Row],
    *,
    sizes: list[int],
    world_size: int,
    cfg: Any,
    ops_per_sample: int,
    busbw_factor: float,
    impl: str = "nccl_tests",
) -> list[dict[str, Any]]:
    """One case per size, its samples the ``-N`` cycles' times; Mismatch where nccl-tests counted
    wrong elements or did not check, ValueError where a size's lines are missing."""
    from sweepbench.collective.ops import Mismatch
    from sweepbench.measure.stats import summarize

    by_size: dict[int, list[Row]] = {}
    for row in rows:
        by_size.setdefault(row.size_bytes, []).append(row)
    if len(by_size) != len(sizes) or any(len(r) != cfg.iters for r in by_size.values()):
        got = {s: len(r) for s, r in by_size.items()}
        raise ValueError(
            f"{BINARIES[op]} printed result lines per size {got}; expected {cfg.iters} for each of {len(sizes)} sizes"
        )
    cases = []
    for size, mine in sorted(by_size.items()):
        for row in mine:
            if row.wrong != 0:
                raise Mismatch(f"{op} at {size} B: nccl-tests' check (-c 1) counted #wrong={row.wrong}")
        times = [row.time_us / 1e6 for row in mine]
        stats = summarize(times)
        algbw = size / stats["median_s"] / 1e9
        cases.append(
            {
                "op": op,
                "size_bytes": size,
                "dtype": cfg.dtype,
                "impl": impl,
                "times_s": times,
                **stats,
                "warmup": cfg.warmup,
                "iters": cfg.iters,
                "ops_per_sample": ops_per_sample,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * busbw_factor,
                "nccl_tests_busbw_gbps": summarize([row.busbw_gbps for row in mine])["median_s"],
            }
        )
    return cases


def library_path() -> str:
    """LD_LIBRARY_PATH for the binaries: the lib/ of the NCCL wheel torch uses (they link its
    libnccl.so.2, which no system path holds) and CUDA's lib64 (libcudart), before the caller's."""
    dirs = []
    try:
        import nvidia.nccl

        dirs.append(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))
    except ImportError:
        pass
    dirs.append(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"))
    return os.pathsep.join(d for d in (*dirs, os.environ.get("LD_LIBRARY_PATH", "")) if d)


def _die_with_rank(parent_pid: int) -> Callable[[], None]:
    """The binary's pre-exec step: SIGKILL it when the rank that started it dies, however the rank
    dies (a job timeout or a stop SIGKILLs the rank, which cannot clean up then)."""
    import ctypes
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def pre_exec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the rank died before prctl ran
            os._exit(1)

    return pre_exec


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_binary(cmd: list[str], out_file: Path | None, *, timeout_s: float) -> str:
    """Run one nccl-tests binary to its end, within ``timeout_s`` (the job's timeout) and
    ``MAX_OUTPUT_BYTES`` of output (its output goes to files, never piling up in memory). It runs
    in a process group of its own, killed whole on either limit or on any error here, and dies with
    the rank (PR_SET_PDEATHSIG), so nothing it started outlives the job."""
    import tempfile
    import time

    from sweepbench.record.atomic import write_atomic

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, "LD_LIBRARY_PATH": library_path()},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=_die_with_rank(os.getpid()),
        )
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{' '.join(cmd)} did not finish within launch.timeout_s={timeout_s:g}s; "
                        f"it was killed (its process group {proc.pid})"
                    )
                if os.fstat(out.fileno()).st_size + os.fstat(err.fileno()).st_size > MAX_OUTPUT_BYTES:
                    raise RuntimeError(
                        f"{' '.join(cmd)} printed more than {MAX_OUTPUT_BYTES >> 20} MiB, "
                        f"not nccl-tests' result lines; it was killed (its process group {proc.pid})"
                    )
                time.sleep(0.05)
        finally:
            _kill_group(proc)  # whatever it left behind in its group; the binary itself on a limit or an error
            proc.wait()
        stdout, stderr = (_head(f) for f in (out, err))
    text = stdout + (f"\n# stderr:\n{stderr}" if stderr else "")
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out_file, " ".join(cmd) + "\n" + text)
    if proc.returncode != 0:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: {tail}")
    return text


def _head(f: Any) -> str:
    f.seek(0)
    return f.read(MAX_OUTPUT_BYTES).decode(errors="replace")


def run_cases_graph(
    ctx: Any, cfg: Any, grid: list[tuple[str, int]], on_case: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The ``nccl_tests_graph`` implementation: ``run_cases`` with nccl-tests' CUDA graphs (``-G 1``)."""
    return run_cases(ctx, cfg, grid, on_case, graph=True)


def run_cases(
    ctx: Any, cfg: Any, grid: list[tuple[str, int]], on_case: Callable[[dict[str, Any]], None], *, graph: bool = False
) -> dict[str, Any]:
    """Rank 0 runs nccl-tests once per op; the other ranks wait on a gloo barrier (off the GPUs)."""
    import torch.distributed as dist

    from sweepbench.collective.ops import OPS
    from sweepbench.core import rank_timeout
    from sweepbench.measure.timing import ops_per_sample

    # the others outwait rank 0's binary, which is killed at launch.timeout_s, so rank 0 tells why
    waiting_room = dist.new_group(backend="gloo", timeout=rank_timeout(ctx.cfg))
    k = ops_per_sample(cfg.ops_per_sample, short_ops=True)
    n = ctx.world_size
    cases: list[dict[str, Any]] = []
    runs: dict[str, Any] = {}
    failure: BaseException | None = None
    if ctx.rank == 0:
        try:
            for op in dict.fromkeys(op for op, _ in grid):
                sizes = [size for o, size in grid if o == op]
                cmd = command(
                    Path(cfg.nccl_tests_dir).expanduser().resolve() / BINARIES[op],
                    world_size=n,
                    cfg=cfg,
                    ops_per_sample=k,
                    graph=graph,
                )
                out = ctx.job_dir / "nccl_tests" / f"{op}.txt" if ctx.job_dir else None
                text = _run_binary(cmd, out, timeout_s=ctx.cfg.launch.timeout_s)
                runs[op] = {"command": " ".join(cmd), **header(text)}
                for case in cases_from_rows(
                    op,
                    parse_output(text),
                    sizes=sizes,
                    world_size=n,
                    cfg=cfg,
                    ops_per_sample=k,
                    busbw_factor=OPS[op].busbw_factor(n),
                    impl="nccl_tests_graph" if graph else "nccl_tests",
                ):
                    cases.append(case)
                    on_case(case)
        except BaseException as err:  # noqa: BLE001 - raised after the others are released
            failure = err
    dist.barrier(group=waiting_room)
    if failure is not None:
        raise failure
    sampling = {
        "ops_per_sample": k,
        "samples": cfg.iters,
        "warmup_calls": cfg.warmup,
        "timer": "nccl-tests' host timer around -n back-to-back ops (one process, all GPUs)",
        "sample": (f"time of one launch of a CUDA graph of {k} calls / {k} (nccl-tests -n {k} -G 1), one -N cycle")
        if graph
        else f"time of {k} back-to-back calls / {k} (nccl-tests -n {k}), one -N cycle",
        "runs": runs,
    }
    return {"cases": cases, "sampling": sampling}
