"""Progress inside a job, as a user at a terminal sees it: the sweep runs under a real
pseudo-terminal, so the driver draws its live line (rich) and updates it with the cases rank 0
reports through the job's store; the same cases are lines in rank 0's log."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from ..conftest import COLLECTIVE, SweepRun, base_env

# 2 ops x 6 sizes with enough iterations that each case lasts a few of the driver's polls
OPS = ("all_reduce", "all_gather")
GRID = [COLLECTIVE, "parallelism=tp2", f"benchmark.ops=[{','.join(OPS)}]", "benchmark.min_bytes=1024",
        "benchmark.max_bytes=32768", "benchmark.step_factor=2", "benchmark.iters=150", "benchmark.warmup=2", "wandb.mode=disabled"]


def _run_on_a_terminal(argv: list[str], *, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """``argv`` with its stdout and stderr on a pty; everything it drew, and its exit status."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the last writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, b"".join(chunks).decode(errors="replace")


def test_live_case_progress_on_a_terminal(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    env = base_env(COLUMNS="120", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    rc, drawn = _run_on_a_terminal([sys.executable, "-m", "sweepbench", "-m", *GRID, f"hydra.sweep.dir={sweep_dir}"],
                                   env=env, timeout=240)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)  # the terminal's control sequences aside
    assert rc == 0, text[-3000:]
    # the live line: the job's cases as rank 0 finished them, while the job ran
    live = re.findall(r"\[1/1\] case (\d+)/12: (all_reduce|all_gather) [\d.]+ KiB: busbw", text)
    seen = {int(i) for i, _ in live}
    assert len(seen) >= 3 and seen <= set(range(1, 13)), text[-3000:]  # updated as cases finished
    # the job's line and the summary come after it, as plain lines
    assert re.search(r"\[1/1\] collective-torch_\S+: ok in [\d.]+s", text), text[-3000:]
    # rank 0's log: every case, in order
    [job] = [p for p in sweep_dir.iterdir() if p.is_dir()]
    steps = SweepRun(sweep_dir, [], subprocess.CompletedProcess([], rc), {}).progress(job.name)
    sizes = ["1 KiB", "2 KiB", "4 KiB", "8 KiB", "16 KiB", "32 KiB"]
    assert [s.split(": busbw")[0] for s in steps] == [f"{i}/12: {op} {size}" for i, (op, size) in
                                                      enumerate(((op, s) for op in OPS for s in sizes), 1)], steps
