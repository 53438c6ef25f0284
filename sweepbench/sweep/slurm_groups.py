"""Many jobs per SLURM allocation (``sweep.jobs_per_allocation=N``): one allocation (one task of
a job array) runs up to N of the sweep's jobs of the same request, one after the other, and pays
the queue wait and the allocation's start once for them.

In each SLURM task (one per rank) ``GroupTask`` starts every job of its group as a fresh child
process (``python -m sweepbench.sweep.slurm_groups``, the same interpreter) that runs the job's
rank exactly as an allocation of its own would (``TaskFunction``), with its own rendezvous port
(``SWEEPBENCH_GROUP_SLOT``, see ``launch.slurm.master_port``). A job that crashes, raises or
hangs past its own time limit (the per-job request's ``timeout_min``) ends alone: its process is
killed, the task writes a note of how it ended (``<job>/logs/group_rank<r>.json``), and the next
job of the group starts. A rank whose peer's process ended badly stops its own at once (it could
only wait in a collective). The sweep driver turns the notes into the job's failed or timeout
metrics.json. Ranks are not kept between the jobs of a group: each job pays its interpreter's,
CUDA's and NCCL's start-up again; what the group saves is the allocation and its queue wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sweepbench.launch.slurm import GROUP_SLOT
from sweepbench.record.atomic import read_json, write_json_atomic

POLL_S = 0.5


def note_path(job_dir: Path, rank: int) -> Path:
    return job_dir / "logs" / f"group_rank{rank}.json"


def clear_notes(job_dir: Path) -> None:
    """Before a submission: a previous run's notes must not pass for this one's."""
    for path in (job_dir / "logs").glob("group_rank*.json"):
        path.unlink(missing_ok=True)


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _peer_failed(job_dir: Path, rank: int) -> int | None:
    """The rank of a peer whose process of this job ended badly on its own, if any."""
    for path in (job_dir / "logs").glob("group_rank*.json"):
        note = read_json(path)
        if isinstance(note, dict) and note.get("rank") != rank and not note.get("stopped_for_peer") \
                and (note.get("exit_code") or note.get("timed_out")):
            return int(note["rank"])
    return None


class GroupTask:
    """What every SLURM task of a group's allocation runs (pickled by submitit): its rank of each
    job of the group, one after the other, each in a child process of its own."""

    def __init__(self, task: Any) -> None:
        self.task = task  # slurm_submit.TaskFunction: one rank of one job

    def __call__(self, overrides: Sequence[Sequence[str]], nums: Sequence[int], request: Any,
                 job_dirs: Sequence[str], job_timeout_s: float) -> list[int]:
        import cloudpickle
        import submitit

        env = submitit.JobEnvironment()
        rank, job_id = env.global_rank, str(env.job_id)
        # SLURM's warning before the allocation's time limit: each job keeps its own limit, and a
        # group is not requeued (that would rerun its jobs already ok), so it only gets a line
        signal.signal(signal.SIGUSR2, _note_time_limit_warning)
        codes = []
        for slot, (job_overrides, num, job_dir) in enumerate(zip(overrides, nums, job_dirs)):
            payload = cloudpickle.dumps((self.task, list(job_overrides), num, request))
            codes.append(_run_child(payload, Path(job_dir), rank=rank, slot=slot, job_id=job_id,
                                    timeout_s=job_timeout_s))
        return codes


def _note_time_limit_warning(signum: int, frame: Any) -> None:
    print("sweepbench group: SLURM's time-limit warning; the running job keeps its own limit", flush=True)


def _run_child(payload: bytes, job_dir: Path, *, rank: int, slot: int, job_id: str, timeout_s: float) -> int:
    tic = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sweepbench.sweep.slurm_groups"], stdin=subprocess.PIPE,
                            env={**os.environ, GROUP_SLOT: str(slot)}, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(payload)
    proc.stdin.close()
    timed_out, peer = False, None
    while proc.poll() is None:
        if time.monotonic() - tic > timeout_s:
            timed_out = True
        else:
            peer = _peer_failed(job_dir, rank)
        if timed_out or peer is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(POLL_S)
    code = proc.wait()
    print(f"sweepbench group: slot {slot} ({job_dir.name}) rank {rank}: exit code {code}"
          f"{', timed out' if timed_out else ''}{f', stopped as rank {peer} failed' if peer is not None else ''}",
          flush=True)
    write_json_atomic(note_path(job_dir, rank), {
        "rank": rank, "slot": slot, "allocation": job_id, "exit_code": code, "timed_out": timed_out,
        "stopped_for_peer": peer, "elapsed_s": round(time.monotonic() - tic, 3), "timeout_s": timeout_s})
    return code


@dataclass(frozen=True)
class GroupOutcome:
    status: str  # failed | timeout
    how: str


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def group_outcome(job_dir: Path) -> GroupOutcome | None:
    """How a job of a group ended badly, per its tasks' notes; None without notes (it never ran)."""
    notes = [n for n in (read_json(p) for p in sorted((job_dir / "logs").glob("group_rank*.json")))
             if isinstance(n, dict)]
    if not notes:
        return None
    where = f"job {notes[0]['slot'] + 1} of its allocation's group"
    if timed := [n for n in notes if n.get("timed_out")]:
        return GroupOutcome("timeout", f"{where}: per-job time limit of {timed[0]['timeout_s']:g} s reached "
                                       f"(rank {timed[0]['rank']})")
    for n in notes:
        if n.get("exit_code") and n.get("stopped_for_peer") is None:
            return GroupOutcome("failed", f"{where}: rank {n['rank']}'s process {_exit_words(n['exit_code'])}")
    return None


def _main() -> None:
    """A child of GroupTask: one rank of one job, as an allocation of its own would run it."""
    import cloudpickle

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # SLURM's time-limit warning is the group task's
    task, overrides, num, request = cloudpickle.loads(sys.stdin.buffer.read())
    task(overrides, num, request)  # raises when the job failed on this rank: exit code 1


if __name__ == "__main__":
    _main()
