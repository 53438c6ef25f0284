"""The sweep directory: checked writable before any job starts, and locked for one sweep at a time.

A bad location (``/proc/x``, a path that is a file, a name too long, a full disk) is bad input:
one ``sweepbench: error:`` line, exit 2, before anything runs. The lock is an flock on the
directory itself (released by the kernel however the driver ends, SIGKILL included); a second
sweep into the same directory refuses, naming the holder."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, NoReturn

from sweepbench.record.atomic import read_json, write_atomic

HOLDER_FILE = ".sweepbench.lock.json"
PROBE_FILE = ".sweepbench.probe"
MIN_FREE_BYTES = 1 << 20


def _reason(err: OSError) -> str:
    if isinstance(err, (FileExistsError, NotADirectoryError)) or err.errno in (errno.EEXIST, errno.ENOTDIR):
        return "a part of it is a file, not a directory"
    return err.strerror or str(err)


def check_writable(sweep_dir: Path, fail: Callable[[str], NoReturn]) -> None:
    """Create the directory and write a probe into it; ``fail`` with one line if that cannot be done."""
    where = f"hydra.sweep.dir={sweep_dir}"
    created = False
    try:
        created = not sweep_dir.exists()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(sweep_dir / PROBE_FILE, "x" * 4096)
        (sweep_dir / PROBE_FILE).unlink()
        stat = os.statvfs(sweep_dir)
        if stat.f_bavail * stat.f_frsize < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as err:
        try:
            if created and sweep_dir.is_dir() and not any(sweep_dir.iterdir()):
                sweep_dir.rmdir()
        except OSError:
            pass
        fail(f"{where} cannot be written: {_reason(err)}; choose another hydra.sweep.dir")


class SweepLock:
    """``with SweepLock(dir, fail):`` holds the directory for this sweep."""

    def __init__(self, sweep_dir: Path, fail: Callable[[str], NoReturn]) -> None:
        self.sweep_dir = sweep_dir
        self.fail = fail
        self.fd = -1

    def __enter__(self) -> "SweepLock":
        self.fd = os.open(self.sweep_dir, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            holder = read_json(self.sweep_dir / HOLDER_FILE) or {}
            who = (
                f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
                if holder
                else "a process that has not said who it is yet"
            )
            self.fail(
                f"hydra.sweep.dir={self.sweep_dir} is in use by another sweep ({who}); wait for it to "
                f"finish or choose another hydra.sweep.dir"
            )
        write_atomic(
            self.sweep_dir / HOLDER_FILE,
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")})
            + "\n",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            (self.sweep_dir / HOLDER_FILE).unlink(missing_ok=True)
        except OSError:  # the directory went read-only: the note stays, the lock (flock) goes all the same
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
