"""The nccl-tests peer of the collective benchmark: its output parsed into cases (on real output of
nccl-tests kept under tests/data/nccl_tests/), its command line, and a missing or incomplete build
refused through the real CLI (one line, exit 2, before any rank starts)."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from sweepbench.collective.nccl_tests import BINARIES, Row, cases_from_rows, command, header, parse_output
from sweepbench.collective.ops import Mismatch

from tests.conftest import COLLECTIVE, run_sweepbench

DATA = Path(__file__).parents[1] / "data" / "nccl_tests"  # captured on an H200 (see README there)
# nccl-tests' busbw factors (doc/PERFORMANCE.md), written out independently of the code under test
NCCL_TESTS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                     "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                     "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
OP_OF = {binary: op for op, binary in BINARIES.items()}


def _cfg(**over: Any) -> Any:
    base = {"min_bytes": 1 << 20, "max_bytes": 1 << 30, "step_factor": 4, "dtype": "float32", "warmup": 5,
            "iters": 1, "ops_per_sample": 20}
    return OmegaConf.create({**base, **over})


# ---------------------------------------------------------------- real output


def _outputs() -> list[Path]:
    return sorted(DATA.glob("*.txt"))


def _run_of(text: str) -> tuple[str, int, list[int]]:
    """(op, GPUs, sizes) from the header nccl-tests printed."""
    test = re.search(r"# Collective test starting: (\w+)", text).group(1)  # type: ignore[union-attr]
    params = re.search(r"nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\(factor\)", text)
    assert params, text[:500]
    n, lo, hi, f = (int(x) for x in params.groups())
    sizes = [lo * f ** e for e in range(64) if lo * f ** e <= hi]
    return OP_OF[test], n, sizes


def test_real_output_is_kept() -> None:
    assert {_run_of(p.read_text())[0] for p in _outputs()} == set(BINARIES)


@pytest.mark.parametrize("path", _outputs(), ids=lambda p: p.stem)
def test_parser_reads_every_size_of_real_output(path: Path) -> None:
    text = path.read_text()
    op, n, sizes = _run_of(text)
    rows = parse_output(text)
    assert [r.size_bytes for r in rows] == sizes
    for r in rows:
        assert r.dtype == "float" and r.size_bytes in (4 * r.count, 4 * r.count * n)  # per-rank or gathered count
        assert r.wrong == 0
        # nccl-tests prints algbw = S / time (GB/s, 1e9), rounded
        assert r.algbw_gbps == pytest.approx(r.size_bytes / (r.time_us / 1e6) / 1e9, rel=0.01)
    assert header(text)["version"].startswith("nccl-tests version")
    assert f"nGpus {n}" in header(text)["parameters"]


@pytest.mark.parametrize("path", _outputs(), ids=lambda p: p.stem)
def test_real_output_becomes_cases_with_nccl_tests_busbw(path: Path) -> None:
    text = path.read_text()
    op, n, sizes = _run_of(text)
    rows = parse_output(text)
    cases = cases_from_rows(op, rows, sizes=sizes, world_size=n, cfg=_cfg(), ops_per_sample=20,
                            busbw_factor=NCCL_TESTS_FACTOR[op](n))
    for case, row in zip(cases, rows, strict=True):
        assert case["op"] == op and case["impl"] == "nccl_tests" and case["size_bytes"] == row.size_bytes
        assert case["times_s"] == [row.time_us / 1e6] and case["median_s"] == row.time_us / 1e6
        # busbw recomputed from the time with nccl-tests' factor agrees with the busbw nccl-tests printed
        assert case["busbw_gbps"] == pytest.approx(row.busbw_gbps, rel=0.01, abs=0.01)
        assert case["nccl_tests_busbw_gbps"] == row.busbw_gbps


# ---------------------------------------------------------------- the format, from nccl-tests' print functions

# two -N cycles of two sizes, in-place columns included, one wrong element in the in-place check only
CYCLES = """\
# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809
# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
host: NCCL INFO this line is not a result
        1024           256     float     sum      -1    10.00    0.10    0.10      0     9.00    0.11    0.11      0
        4096          1024     float     sum      -1    20.00    0.20    0.20      0    19.00    0.22    0.22      1
        1024           256     float     sum      -1    12.00    0.09    0.09      0     9.00    0.11    0.11      0
        4096          1024     float     sum      -1    30.00    0.14    0.14      0    19.00    0.22    0.22      0
# Out of bounds values : 0 OK
"""


def test_cycles_are_samples_of_out_of_place_times() -> None:
    rows = parse_output(CYCLES)
    assert len(rows) == 4 and rows[1] == Row(4096, 1024, "float", 20.0, 0.2, 0.2, 0)
    cases = cases_from_rows("all_reduce", rows, sizes=[1024, 4096], world_size=2, cfg=_cfg(iters=2),
                            ops_per_sample=20, busbw_factor=1.0)
    assert [c["times_s"] for c in cases] == [[10 / 1e6, 12 / 1e6], [20 / 1e6, 30 / 1e6]]
    assert cases[1]["median_s"] == pytest.approx(25e-6) and cases[1]["min_s"] == 20 / 1e6
    assert cases[1]["algbw_gbps"] == pytest.approx(4096 / 25e-6 / 1e9)


def test_a_wrong_element_or_an_unchecked_run_fails() -> None:
    wrong = CYCLES.replace("0.20    0.20      0    19.00", "0.20    0.20      3    19.00")
    with pytest.raises(Mismatch, match=r"all_reduce at 4096 B: nccl-tests' check \(-c 1\) counted #wrong=3"):
        cases_from_rows("all_reduce", parse_output(wrong), sizes=[1024, 4096], world_size=2, cfg=_cfg(iters=2),
                        ops_per_sample=20, busbw_factor=1.0)
    unchecked = CYCLES.replace("0.10    0.10      0 ", "0.10    0.10    N/A ")
    with pytest.raises(Mismatch, match="#wrong=None"):
        cases_from_rows("all_reduce", parse_output(unchecked), sizes=[1024, 4096], world_size=2,
                        cfg=_cfg(iters=2), ops_per_sample=20, busbw_factor=1.0)


def test_missing_lines_fail() -> None:
    with pytest.raises(ValueError, match="expected 3 for each of 2 sizes"):
        cases_from_rows("all_reduce", parse_output(CYCLES), sizes=[1024, 4096], world_size=2, cfg=_cfg(iters=3),
                        ops_per_sample=20, busbw_factor=1.0)


def test_command_passes_the_job_settings() -> None:
    cmd = command(Path("/x/all_gather_perf"), world_size=4, cfg=_cfg(iters=10, dtype="bfloat16"), ops_per_sample=20)
    assert cmd == ["/x/all_gather_perf", "-g", "4", "-b", str(1 << 20), "-e", str(1 << 30), "-f", "4",
                   "-d", "bfloat16", "-w", "5", "-n", "20", "-N", "10", "-c", "1"]
    graph = command(Path("/x/all_gather_perf"), world_size=4, cfg=_cfg(iters=10, dtype="bfloat16"), ops_per_sample=20,
                    graph=True)
    assert graph == [*cmd, "-G", "1"]


def test_each_impl_is_paired_on_the_page_with_the_peer_timed_the_same_way() -> None:
    from sweepbench.benchmarks.collective import _page_derive

    def row(impl: str, busbw: float, run: str = "r1") -> dict[str, Any]:
        return {"impl": impl, "run": run, "world_size": 4, "op": "all_reduce", "size_bytes": 1 << 20,
                "busbw_gbps": busbw}
    rows = [row("torch", 90.0), row("torch_graph", 120.0), row("nccl_tests", 100.0), row("nccl_tests_graph", 125.0),
            row("torch", 50.0, run="r2")]
    _page_derive(rows, rows)
    eager, graph, _, _, other_run = rows
    assert eager["nccl_tests_busbw_gbps"] == 100.0 and eager["ratio"] == 0.9 and not eager["meets_target"]
    assert graph["nccl_tests_busbw_gbps"] == 125.0 and graph["ratio"] == 0.96 and graph["meets_target"]
    assert "ratio" not in rows[2] and "ratio" not in rows[3] and "ratio" not in other_run  # no peer in run r2


# ---------------------------------------------------------------- a bad build, through the CLI


def _fake_build(where: Path, names: list[str]) -> Path:
    where.mkdir(parents=True)
    for name in names:
        (where / name).write_text("#!/bin/sh\nexit 1\n")
        (where / name).chmod(stat.S_IRWXU)
    return where


@pytest.mark.parametrize("case", ["missing", "lacks", "unset"])
def test_a_bad_build_exits_2_with_one_line_before_any_rank(tmp_path: Path, case: str) -> None:
    build = tmp_path / "build"
    if case == "lacks":
        _fake_build(build, [BINARIES["all_reduce"]])
    where = [] if case == "unset" else [f"benchmark.nccl_tests_dir={build}"]
    expected = {"missing": f"benchmark.nccl_tests_dir={build} is not a directory",
                "lacks": f"benchmark.nccl_tests_dir={build} lacks sendrecv_perf",
                "unset": "benchmark.impl=nccl_tests needs benchmark.nccl_tests_dir="}[case]
    args = [COLLECTIVE, "parallelism=tp2", "benchmark.impl=torch,nccl_tests", "benchmark.ops=[all_reduce,send_recv]",
            *where]
    cwd, sweep_dir = tmp_path / "cwd", tmp_path / "sweep"
    run = run_sweepbench(args, sweep_dir=sweep_dir, cwd=cwd)
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: "), run.stderr
    assert expected in lines[0] and "all_reduce_perf, sendrecv_perf" in lines[0], lines[0]
    if case != "unset":
        assert "bench/peers/build_nccl_tests.sh" in lines[0]
    assert not sweep_dir.exists() and list(cwd.iterdir()) == []
    assert "Launching" not in run.stdout


def test_a_complete_build_needs_gpus(tmp_path: Path) -> None:
    build = _fake_build(tmp_path / "build", list(BINARIES.values()))
    run = run_sweepbench([COLLECTIVE, "parallelism=tp2", "benchmark.impl=nccl_tests", f"benchmark.nccl_tests_dir={build}",
                          "backend=gloo"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    assert "benchmark.impl=nccl_tests runs on GPUs, not backend=gloo" in run.stderr


# ---------------------------------------------------------------- the peer's ranks, on a real 2-rank gloo group
# nccl-tests needs GPUs, so here a stand-in script in its place prints real captured output and
# records its arguments: what runs is sweepbench's side (who launches, who waits, what is kept).


def peer_job(rank: int, world_size: int, build: str, job_dir: str, timeout_s: float = 60,
             graph: bool = False) -> dict[str, Any]:
    import torch

    from sweepbench.collective.nccl_tests import run_cases, run_cases_graph
    from sweepbench.core import RankContext

    cfg = OmegaConf.create({"launch": {"timeout_s": timeout_s}, "benchmark": {
        **_cfg(max_bytes=64 << 20), "ops": ["all_reduce"], "nccl_tests_dir": build}})
    ctx = RankContext(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                      backend="gloo", cfg=cfg, job_dir=Path(job_dir))
    seen: list[dict[str, Any]] = []
    grid = [("all_reduce", s) for s in (1 << 20, 4 << 20, 16 << 20, 64 << 20)]
    try:
        done = (run_cases_graph if graph else run_cases)(ctx, cfg.benchmark, grid, seen.append)
    except (RuntimeError, ValueError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    return {**done, "seen": len(seen)}


def _stand_in(build: Path, script: str) -> None:
    build.mkdir(parents=True, exist_ok=True)
    binary = build / BINARIES["all_reduce"]
    binary.write_text("#!/bin/sh\n" + script)
    binary.chmod(stat.S_IRWXU)


def test_rank_0_runs_the_binary_and_the_others_wait(worlds: Any, tmp_path: Path) -> None:
    build = tmp_path / "build"
    _stand_in(build, f'echo "$@" > {tmp_path}/argv\ncat {DATA}/all_reduce.txt\n')
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"))
    assert r1["cases"] == [] and r1["seen"] == 0  # rank 1 ran nothing, and was released
    assert (tmp_path / "argv").read_text().split() == [
        "-g", "2", "-b", str(1 << 20), "-e", str(64 << 20), "-f", "4", "-d", "float", "-w", "5", "-n", "20",
        "-N", "1", "-c", "1"]
    rows = parse_output((DATA / "all_reduce.txt").read_text())
    assert r0["seen"] == 4 and [c["median_s"] for c in r0["cases"]] == [r.time_us / 1e6 for r in rows]
    assert r0["sampling"]["ops_per_sample"] == 20 and r0["sampling"]["samples"] == 1
    assert r0["sampling"]["runs"]["all_reduce"]["version"].startswith("nccl-tests version 2.19.6")
    kept = (tmp_path / "job" / "nccl_tests" / "all_reduce.txt").read_text()  # the raw output, with its command
    assert kept.splitlines()[0].endswith("all_reduce_perf -g 2 -b 1048576 -e 67108864 -f 4 -d float -w 5 -n 20 -N 1 -c 1")
    assert (DATA / "all_reduce.txt").read_text() in kept


def test_the_graph_peer_passes_minus_G_and_names_its_cases(worlds: Any, tmp_path: Path) -> None:
    build = tmp_path / "build"
    _stand_in(build, f'echo "$@" > {tmp_path}/argv\ncat {DATA}/all_reduce.txt\n')
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"), 60, True)
    assert r1["cases"] == [] and (tmp_path / "argv").read_text().split()[-2:] == ["-G", "1"]
    assert {c["impl"] for c in r0["cases"]} == {"nccl_tests_graph"} and r0["seen"] == 4
    assert "-G 1" in r0["sampling"]["sample"] and "-G 1" in r0["sampling"]["runs"]["all_reduce"]["command"]


def test_a_failing_binary_fails_rank_0_and_releases_the_others(worlds: Any, tmp_path: Path) -> None:
    build = tmp_path / "build"
    _stand_in(build, 'echo "Invalid number of GPUs: 2 requested but only 1 were found." >&2\nexit 1\n')
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"))
    assert "all_reduce_perf -g 2" in r0["error"] and "exited with 1: Invalid number of GPUs" in r0["error"]
    assert r1["cases"] == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _pids(path: Path, count: int, *, within_s: float = 30) -> list[int]:
    deadline = time.monotonic() + within_s
    while True:
        if path.exists() and len(text := path.read_text().split()) == count:
            return [int(pid) for pid in text]
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise AssertionError(f"{path} did not get {count} pids")


def test_a_hung_binary_and_what_it_started_are_gone_after_the_job_timeout(worlds: Any, tmp_path: Path) -> None:
    """A stand-in that hangs, with a child of its own: both are killed (the binary's own process
    group) when the job's launch.timeout_s runs out, the job fails naming the timeout, rank 1 is
    released."""
    build, pids = tmp_path / "build", tmp_path / "pids"
    _stand_in(build, f"sleep 300 &\necho $$ $! > {pids}.tmp && mv {pids}.tmp {pids}\nwait\n")
    tic = time.monotonic()
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"), 3)
    took = time.monotonic() - tic
    binary, child = _pids(pids, 2, within_s=0)
    assert 3 <= took < 20, took
    assert r0["error"].startswith("RuntimeError: ") and "all_reduce_perf -g 2" in r0["error"], r0
    assert "did not finish within launch.timeout_s=3s; it was killed" in r0["error"], r0
    assert r1["cases"] == []
    deadline = time.monotonic() + 5
    while (_alive(binary) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(binary) and not _alive(child), (binary, child)


def test_a_hung_binary_dies_with_the_rank_that_started_it(tmp_path: Path) -> None:
    """The launcher's job timeout or a stop SIGKILLs the rank, which cannot clean up then: the
    binary dies with it (PR_SET_PDEATHSIG)."""
    build, pids = tmp_path / "build", tmp_path / "pids"
    _stand_in(build, f"echo $$ > {pids}.tmp && mv {pids}.tmp {pids}\nexec sleep 300\n")
    code = ("from pathlib import Path; from sweepbench.collective.nccl_tests import _run_binary; "
            f"_run_binary([{str(build / BINARIES['all_reduce'])!r}], None, timeout_s=300)")
    rank = subprocess.Popen([sys.executable, "-c", code])
    try:
        (binary,) = _pids(pids, 1)
        assert _alive(binary)
        rank.kill()
        rank.wait(10)
        deadline = time.monotonic() + 5
        while _alive(binary) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(binary), binary
    finally:
        rank.kill()


def test_a_binary_that_floods_its_output_is_killed_at_the_limit(worlds: Any, tmp_path: Path) -> None:
    """Output goes to files and is capped (MAX_OUTPUT_BYTES): a binary printing without end is
    killed there, long before the job's timeout, instead of filling the rank's memory."""
    from sweepbench.collective.nccl_tests import MAX_OUTPUT_BYTES

    build, pids = tmp_path / "build", tmp_path / "pids"
    _stand_in(build, f"echo $$ > {pids}.tmp && mv {pids}.tmp {pids}\nexec yes 'not a result line'\n")
    tic = time.monotonic()
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"), 120)
    assert time.monotonic() - tic < 60
    assert f"printed more than {MAX_OUTPUT_BYTES >> 20} MiB, not nccl-tests' result lines; it was killed" in r0["error"]
    assert r1["cases"] == [] and not _alive(_pids(pids, 1, within_s=0)[0])


@pytest.mark.parametrize("junk", ["text", "numbers", "binary", "zero_time"])
def test_a_binary_printing_junk_fails_the_job_with_one_clear_error(worlds: Any, tmp_path: Path, junk: str) -> None:
    build = tmp_path / "build"
    script = {"text": "echo 'Segmentation fault? no: just junk'\nseq 1 5\n",
              "numbers": "i=0; while [ $i -lt 4 ]; do echo '1048576 262144 float sum -1 x.y 1 1 0 1 1 1 0'; "
                         "i=$((i+1)); done\n",
              "binary": "head -c 4096 /dev/urandom\n",
              "zero_time": "for s in 1048576 4194304 16777216 67108864; do "
                           "echo \"$s 1 float sum -1 0.00 0 0 0 0 0 0 0\"; done\n"}[junk]
    _stand_in(build, script)
    r0, r1 = worlds.get(2).run(peer_job, str(build), str(tmp_path / "job"))
    assert r0["error"].startswith("ValueError: all_reduce_perf printed result lines per size {}; expected 1 "
                                  "for each of 4 sizes"), r0
    assert r1["cases"] == []
    assert (tmp_path / "job" / "nccl_tests" / "all_reduce.txt").exists()  # what it printed is kept


def test_the_plot_has_a_line_per_impl() -> None:
    from sweepbench.benchmarks.collective import CollectiveBenchmark

    text = (DATA / "sendrecv.txt").read_text()
    op, _, sizes = _run_of(text)
    n = 2  # the committed output is one GPU's; a one-rank collective moves nothing and is kept out of plots
    peer = cases_from_rows(op, parse_output(text), sizes=sizes, world_size=n, cfg=_cfg(), ops_per_sample=20,
                           busbw_factor=1.0)
    ours = [{**c, "impl": "torch", "busbw_gbps": c["busbw_gbps"] / 2} for c in peer]
    jobs = [{"status": "ok", "tag": f"collective-{impl}", "world_size": n, "backend": "nccl", "results": {"cases": cases}}
            for impl, cases in (("torch", ours), ("nccl_tests", peer))]
    (plot,) = CollectiveBenchmark.plots(jobs)
    labels = plot.figure.axes[0].get_legend_handles_labels()[1]
    assert {f"send_recv ws{n} torch", f"send_recv ws{n} nccl_tests"} <= set(labels), labels


def test_an_unknown_impl_is_refused_with_the_valid_ones(compose: Any) -> None:
    from sweepbench.launch.preflight import validate

    with pytest.raises(ValueError, match=r"^benchmark.impl='nccl'; valid: nccl_tests, nccl_tests_graph, torch, torch_graph$"):
        validate(compose("parallelism=tp2", "benchmark.impl=nccl"))
    assert validate(compose("parallelism=tp2", "benchmark.impl=torch")) == 2


def test_torch_graph_is_planned_from_a_host_without_gpus_and_refused_on_gloo(compose: Any) -> None:
    """impl=torch_graph captures CUDA graphs. With backend=auto on this CPU machine it is this machine's
    limit: planned (validate_config lets it through), then a dry run's fit note and a real run's refusal,
    both naming the backend auto gives the job here (gloo). With backend=gloo named it is bad input."""
    from sweepbench.core import NotOnThisMachine
    from sweepbench.launch.preflight import fit_note, validate, validate_config

    cfg = compose("parallelism=tp2", "benchmark.impl=torch_graph")
    why = "benchmark.impl=torch_graph captures CUDA graphs: it runs on GPUs, not backend=gloo"
    with pytest.raises(ValueError, match=f"^{why}"):
        validate(cfg)
    assert fit_note(cfg, validate_config(cfg, plan=True), local=True).startswith(why)
    with pytest.raises(ValueError, match="not backend=gloo") as err:
        validate_config(compose("parallelism=tp2", "benchmark.impl=torch_graph", "backend=gloo"), plan=True)
    assert not isinstance(err.value, NotOnThisMachine)


def test_nccl_buffers_are_refused_off_gpus_and_a_bad_value_names_the_valid_ones(compose: Any) -> None:
    """benchmark.buffers=nccl allocates through NCCL's allocator: on gloo it is bad input, one line; a peer
    that allocates its own way (nccl-tests: ncclMemAlloc) is not refused for it; a bad value names both."""
    from sweepbench.core import NotOnThisMachine
    from sweepbench.launch.preflight import validate, validate_config

    why = "benchmark.buffers=nccl allocates through NCCL's allocator: it runs on GPUs, not backend=gloo"
    with pytest.raises(ValueError, match=f"^{why}; use backend=nccl") as err:
        validate_config(compose("parallelism=tp2", "benchmark.buffers=nccl", "backend=gloo"), plan=True)
    assert not isinstance(err.value, NotOnThisMachine)
    with pytest.raises(ValueError, match=f"^{why}"):
        validate(compose("parallelism=tp2", "benchmark.buffers=nccl"))  # auto gives this host gloo
    with pytest.raises(ValueError, match=r"^benchmark.buffers='pinned'; valid: caching, nccl$"):
        validate(compose("parallelism=tp2", "benchmark.buffers=pinned"))


def test_the_page_names_each_rows_buffers_and_ranks_them_as_ways_of_one_case() -> None:
    """A row from before benchmark.buffers: torch's impls allocated from torch's cache, nccl-tests with
    ncclMemAlloc; the page's cases split by buffers but compare across them (a way, like impl)."""
    from sweepbench.benchmarks.collective import CollectiveBenchmark, _page_derive

    rows = [{"impl": i, "run": "r", "world_size": 2, "op": "all_gather", "size_bytes": 1 << 20, "busbw_gbps": 1.0}
            for i in ("torch", "torch_graph", "nccl_tests", "nccl_tests_graph")]
    rows.append({**rows[1], "buffers": "nccl"})
    _page_derive(rows, rows)
    assert [r["buffers"] for r in rows] == ["caching", "caching", "nccl", "nccl", "nccl"]
    spec = CollectiveBenchmark.page()
    assert "buffers" in spec.case and spec.ways == ("buffers",) and "buffers" in spec.columns
