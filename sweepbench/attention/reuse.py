"""T1 and the single-device reference, kept in the sweep directory and reused by the sweep's later
jobs of the same case: ``<sweep dir>/.sweepbench-cache/attention/<key hash>/``.

The key holds everything they depend on: the shape, dtype, mask and pattern, the seed of the
inputs, T1's iterations and candidates, the device's name and the software (torch, CUDA, cuDNN,
threads). A job of a multirun finds its sweep directory as its job directory's parent (Hydra's
``hydra.sweep.dir``, which holds ``multirun.yaml``); a single run keeps nothing. One job at a time
measures a key (an flock on the key's lock file); the files are written atomically, ``entry.json``
last (what makes the entry exist). With ``sweep.force=true`` an entry is reused only if this same
sweep run wrote it (``multirun.yaml`` is rewritten when a sweep starts: its inode and mtime name
the run)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from sweepbench.record.atomic import read_json, write_json_atomic

CACHE_DIR = ".sweepbench-cache/attention"
SWEEP_MARK = "multirun.yaml"


def software_key(device: torch.device) -> dict[str, Any]:
    """The device's name and the software versions that T1 and the reference depend on."""
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else f"{platform.machine()} {platform.processor()}",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None,
        "num_threads": torch.get_num_threads(),
    }


class SweepStore:
    """The cache of one sweep directory, as seen by rank 0 of one job."""

    def __init__(self, sweep_dir: Path, *, force: bool) -> None:
        mark = (sweep_dir / SWEEP_MARK).stat()
        self.root = sweep_dir / CACHE_DIR
        self.run = f"{mark.st_ino}-{mark.st_mtime_ns}"
        self.force = force

    @classmethod
    def of_job(cls, job_dir: Path | None, *, force: bool) -> "SweepStore | None":
        """The store of the sweep ``job_dir`` belongs to; None outside a multirun."""
        if job_dir is None or not (job_dir.parent / SWEEP_MARK).is_file():
            return None
        return cls(job_dir.parent, force=force)

    @contextmanager
    def entry(self, key: dict[str, Any]) -> Iterator["Entry"]:
        """The key's entry, held for this job alone until the block ends."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
        where = self.root / digest
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(where / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield Entry(where, key=key, run=self.run, force=self.force)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class Entry:
    def __init__(self, where: Path, *, key: dict[str, Any], run: str, force: bool) -> None:
        self.where, self.key, self.run = where, key, run
        meta = read_json(where / "entry.json")
        usable = isinstance(meta, dict) and meta.get("key") == json.loads(json.dumps(key, default=str))
        self.meta = meta if usable and (not force or meta.get("run") == run) else None

    def t1(self) -> dict[str, Any] | None:
        """{"stats": {backend: stats}, "refused": {backend: why}} as a previous job measured it."""
        return self.meta["t1"] if self.meta else None

    def value(self, name: str) -> Any:
        """A value a previous job of the sweep stored in this entry with ``put`` (None: none)."""
        return self.meta.get(name) if self.meta else None

    def put(self, name: str, value: Any) -> None:
        """Store a value for the sweep's later jobs (an entry of its own key, without a reference)."""
        self.meta = {"key": self.key, "run": self.run, name: value}
        write_json_atomic(self.where / "entry.json", self.meta)

    def reference(self, device: torch.device) -> list[torch.Tensor] | None:
        if not self.meta:
            return None
        try:
            return torch.load(self.where / "reference.pt", map_location=device, weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - unreadable (torn by a crash, another torch): measured again
            return None

    def reference_tmp(self) -> Path:
        """A fresh temporary in the entry's folder for the reference (``commit`` makes it the
        entry's; the writer, this process or T1's child, streams it there)."""
        fd, tmp = tempfile.mkstemp(dir=self.where, prefix=".reference.pt.", suffix=".tmp")
        os.close(fd)
        return Path(tmp)

    def commit(self, t1: dict[str, Any], tmp: Path) -> None:
        """The written temporary becomes the entry's reference.pt (renamed: record.atomic's pattern,
        without its in-memory copy and fsync: GiBs at long sequences; a torn file after a crash
        fails to load and is remade), then entry.json, which makes the entry exist."""
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.where / "reference.pt")
        self.meta = {"key": self.key, "run": self.run, "t1": t1}
        write_json_atomic(self.where / "entry.json", self.meta)

    def save(self, t1: dict[str, Any], reference: list[torch.Tensor]) -> None:
        tmp = self.reference_tmp()
        try:
            with open(tmp, "wb") as f:
                torch.save([x.detach().cpu() for x in reference], f)
            self.commit(t1, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
