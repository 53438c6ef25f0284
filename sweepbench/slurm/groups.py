"""Many jobs per SLURM allocation (``sweep.jobs_per_allocation=N``): one allocation (one task of
a job array) runs up to N of the sweep's jobs of the same request, one after the other, and pays
the queue wait and the allocation's start once for them.

In each SLURM task (one per rank) ``GroupTask`` starts every job of its group as a fresh child
process (``python -m sweepbench.slurm.groups``, the same interpreter) that runs the job's
rank exactly as an allocation of its own would (``TaskFunction``), with its own rendezvous port
(``SWEEPBENCH_GROUP_SLOT``, see ``slurm.tasks.master_port``). A job that crashes, raises or
hangs past its own time limit (the per-job request's ``timeout_min``) ends alone: its process is
killed, the task writes a note of how it ended (``<job>/logs/group_rank<r>.json``), and the next
job of the group starts. A rank whose peer's process ended badly stops its own at once (it could
only wait in a collective). The sweep driver turns the notes into the job's failed or timeout
metrics.json. With ``launch.keep_ranks=true`` a rank's process that ended its job ok runs its
rank of the group's next job too (as kept local ranks do), so the interpreter's start-up and
imports, and CUDA's and NCCL's first-use costs, are paid once per group; a process whose job
failed or was stopped exits, and the next job starts a fresh one. Otherwise each job starts fresh,
and what a group saves is the allocations and their queue waits."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sweepbench.launch.rank_errors import exit_how
from sweepbench.record.atomic import read_json, write_json_atomic
from sweepbench.slurm.tasks import GROUP_SLOT

POLL_S = 0.5


def note_path(job_dir: Path, rank: int) -> Path:
    return job_dir / "logs" / f"group_rank{rank}.json"


def clear_notes(job_dir: Path) -> None:
    """Before a submission: a previous run's notes must not pass for this one's."""
    for path in (job_dir / "logs").glob("group_rank*.json"):
        path.unlink(missing_ok=True)


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _peer_failed(job_dir: Path, rank: int) -> int | None:
    """The rank of a peer whose process of this job ended badly on its own, if any."""
    for path in (job_dir / "logs").glob("group_rank*.json"):
        note = read_json(path)
        if (
            isinstance(note, dict)
            and note.get("rank") != rank
            and note.get("stopped_for_peer") is None
            and (note.get("exit_code") or note.get("timed_out"))
        ):
            return int(note["rank"])
    return None


class GroupTask:
    """What every SLURM task of a group's allocation runs (pickled by submitit): its rank of each
    job of the group, one after the other, each in a child process of its own."""

    def __init__(self, task: Any) -> None:
        self.task = task  # submit.TaskFunction: one rank of one job

    def __call__(
        self,
        overrides: Sequence[Sequence[str]],
        nums: Sequence[int],
        request: Any,
        job_dirs: Sequence[str],
        job_timeout_s: float,
        keep: bool = False,
    ) -> list[int]:
        import cloudpickle
        import submitit

        env = submitit.JobEnvironment()
        rank, job_id = env.global_rank, str(env.job_id)
        # SLURM's warning before the allocation's time limit: each job keeps its own limit, and a
        # group is not requeued (that would rerun its jobs already ok), so it only gets a line
        signal.signal(signal.SIGUSR2, _note_time_limit_warning)
        codes = []
        child: _Child | None = None
        for slot, (job_overrides, num, job_dir) in enumerate(zip(overrides, nums, job_dirs)):
            child = child or _Child()
            payload = cloudpickle.dumps((self.task, list(job_overrides), num, request, slot))
            code = child.run(payload, Path(job_dir), rank=rank, slot=slot, job_id=job_id, timeout_s=job_timeout_s)
            codes.append(code)
            if code != 0 or not keep:
                child.end()
                child = None
        if child is not None:
            child.end()
        return codes


def _note_time_limit_warning(signum: int, frame: Any) -> None:
    print("sweepbench group: SLURM's time-limit warning; the running job keeps its own limit", flush=True)


class _Child:
    """One process running this task's rank of the group's jobs: one job, or (``launch.keep_ranks``)
    each next one after a job that ended ok. Jobs come framed on its stdin; after each job it
    writes one byte to its result pipe (0: ok); one that failed exits."""

    def __init__(self) -> None:
        self.results, result_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sweepbench.slurm.groups", str(result_w)],
            stdin=subprocess.PIPE,
            pass_fds=(result_w,),
            start_new_session=True,
        )
        os.close(result_w)

    def run(self, payload: bytes, job_dir: Path, *, rank: int, slot: int, job_id: str, timeout_s: float) -> int:
        tic = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
        self.proc.stdin.flush()
        timed_out, peer, code = False, None, None
        while code is None:
            ready, _, _ = select.select([self.results], [], [], POLL_S)
            result = os.read(self.results, 1) if ready else None
            if result:  # the job ended; 0 = ok, and the process waits for the next one
                code = result[0]
            elif result == b"" or self.proc.poll() is not None:  # the process ended
                code = self.proc.wait()
            elif time.monotonic() - tic > timeout_s:
                timed_out = True
            elif (peer := _peer_failed(job_dir, rank)) is None:
                continue
            if timed_out or peer is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                code = self.proc.wait()
        print(
            f"sweepbench group: slot {slot} ({job_dir.name}) rank {rank}: exit code {code}"
            f"{', timed out' if timed_out else ''}"
            f"{f', stopped as rank {peer} failed' if peer is not None else ''}",
            flush=True,
        )
        write_json_atomic(
            note_path(job_dir, rank),
            {
                "rank": rank,
                "slot": slot,
                "allocation": job_id,
                "pid": self.proc.pid,
                "exit_code": code,
                "timed_out": timed_out,
                "stopped_for_peer": peer,
                "elapsed_s": round(time.monotonic() - tic, 3),
                "timeout_s": timeout_s,
            },
        )
        return code

    def end(self) -> None:
        """No more jobs: close its stdin (a kept process leaves), or kill it if it does not."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.results)


@dataclass(frozen=True)
class GroupOutcome:
    status: str  # failed | timeout
    how: str


def group_outcome(job_dir: Path) -> GroupOutcome | None:
    """How a job of a group ended badly, per its tasks' notes; None without notes (it never ran)."""
    notes = [
        n for n in (read_json(p) for p in sorted((job_dir / "logs").glob("group_rank*.json"))) if isinstance(n, dict)
    ]
    if not notes:
        return None
    where = f"job {notes[0]['slot'] + 1} of its allocation's group"
    if timed := [n for n in notes if n.get("timed_out")]:
        return GroupOutcome(
            "timeout", f"{where}: per-job time limit of {timed[0]['timeout_s']:g} s reached (rank {timed[0]['rank']})"
        )
    for n in notes:
        if n.get("exit_code") and n.get("stopped_for_peer") is None:
            return GroupOutcome("failed", f"{where}: rank {n['rank']}'s process ended ({exit_how(n['exit_code'])})")
    return None


def _main(result_fd: int) -> None:
    """A child of GroupTask: its rank of each job it is sent, as an allocation of its own would
    run it; it leaves when its stdin closes or a job fails (exit code 1)."""
    import cloudpickle

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # SLURM's time-limit warning is the group task's
    from sweepbench.launch import rank

    stdin = sys.stdin.buffer
    taken = 0
    while size := stdin.read(8):
        # a kept process's start-up counts for its first job; each next one's from when it came
        rank.JOB_TAKEN = time.monotonic() if taken else None
        taken += 1
        task, overrides, num, request, slot = cloudpickle.loads(stdin.read(int.from_bytes(size, "big")))
        os.environ[GROUP_SLOT] = str(slot)
        task(overrides, num, request)  # raises when the job failed on this rank: exit code 1
        os.write(result_fd, b"\0")


if __name__ == "__main__":
    _main(int(sys.argv[1]))
