"""The store of baselines: measurements a benchmark takes before its own timing (attention's T1
and reference) kept beyond the sweep, per key, as asv keeps results per machine and environment.

Layout: ``<root>/<kind>/<key hash>/`` holds ``entry.json`` (the key, the values, and where and
when they were measured: ``measured``) and the entry's files (``reference.pt``). The key is the
caller's: everything the value depends on (shape, device name, driver, software versions). The
root is ``store.dir``, by default ``$SWEEPBENCH_STORE_DIR`` or ``$XDG_CACHE_HOME/sweepbench/store``
(``~/.cache/sweepbench/store``).

One process at a time holds an entry (an flock on its ``.lock``, checked to be the lock file
still in place, since eviction removes whole entries); files are written atomically,
``entry.json`` last (what makes the entry exist). A torn or hostile ``entry.json`` is ignored
with one line and measured again. ``store.refresh=true`` reuses only what this same sweep run
measured (the sweep's first job of each key measures afresh and replaces the entry). After each
write the oldest entries (by their ``entry.json``'s time) beyond ``store.max_mb`` are removed,
skipping those another process holds."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from sweepbench.record.atomic import write_json_atomic

ENTRY_FILE = "entry.json"
LOCK_FILE = ".lock"
SWEEP_MARK = "multirun.yaml"  # written when a sweep starts: its inode and mtime name the sweep run
DEFAULT_MAX_MB = 16384


def default_dir() -> Path:
    """``$SWEEPBENCH_STORE_DIR``, else ``$XDG_CACHE_HOME/sweepbench/store`` (``~/.cache/...``)."""
    if os.environ.get("SWEEPBENCH_STORE_DIR"):
        return Path(os.environ["SWEEPBENCH_STORE_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sweepbench" / "store"


@dataclass(frozen=True)
class StoreSettings:
    """The ``store`` config group as the engines see it (no Hydra)."""

    dir: str | None = None  # None: default_dir(); "": off
    enabled: bool = True
    refresh: bool = False  # measure afresh (once per sweep run) and replace
    max_mb: float = DEFAULT_MAX_MB

    def root(self) -> Path | None:
        if not self.enabled or self.dir == "":
            return None
        return Path(self.dir).expanduser() if self.dir else default_dir()


def sweep_run(job_dir: Path | None) -> str:
    """A name of the sweep run ``job_dir`` belongs to (its own directory or a round's,
    ``<tag>/rounds/<r>``): the sweep directory's ``multirun.yaml`` inode and mtime, else the job's."""
    if job_dir is None:
        return f"pid-{os.getpid()}-{time.time_ns()}"
    for folder in [job_dir, *list(job_dir.parents)[:3]]:
        mark = folder / SWEEP_MARK
        if mark.is_file():
            st = mark.stat()
            return f"{folder}:{st.st_ino}-{st.st_mtime_ns}"
    return f"{job_dir}:{time.time_ns()}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _size(folder: Path) -> int:
    total = 0
    for p in folder.iterdir():
        try:
            total += p.lstat().st_size
        except OSError:
            pass
    return total


class Store:
    """The store under ``root``, as one job's rank 0 sees it."""

    def __init__(
        self, root: Path, *, refresh: bool = False, max_mb: float = DEFAULT_MAX_MB, run: str = "", job: str = ""
    ) -> None:
        self.root, self.refresh, self.max_bytes = Path(root), refresh, int(max_mb * 2**20)
        self.run = run or sweep_run(None)
        self.origin = {"host": socket.gethostname(), "job": job, "store": str(self.root)}

    @classmethod
    def of_job(cls, settings: StoreSettings, job_dir: Path | None) -> "Store | None":
        root = settings.root()
        if root is None:
            return None
        return cls(
            root, refresh=settings.refresh, max_mb=settings.max_mb, run=sweep_run(job_dir), job=str(job_dir or "")
        )

    def stamp(self) -> dict[str, Any]:
        """Where and when a value is measured, now: {"at", "host", "job", "store"}."""
        return {"at": _now(), **self.origin}

    @contextmanager
    def entry(self, kind: str, key: dict[str, Any]) -> Iterator["Entry"]:
        """The key's entry, held for this process alone until the block ends."""
        where = self.root / kind / _digest(key)
        fd = _lock(where)
        try:
            yield Entry(self, where, key=key)
        finally:
            if not (where / ENTRY_FILE).exists():  # a look-up that stored nothing leaves no folder
                (where / LOCK_FILE).unlink(missing_ok=True)
                try:
                    where.rmdir()
                except OSError:
                    pass
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def evict(self, *, keep: Path | None = None) -> list[Path]:
        """Remove the oldest entries until the store is within ``max_bytes`` (never ``keep``, nor
        an entry another process holds); the removed entries."""
        entries = sorted(all_entries(self.root), key=lambda e: e["mtime"])
        total = sum(e["bytes"] for e in entries)
        removed = []
        for e in entries:
            if total <= self.max_bytes:
                break
            if e["path"] == keep or not _remove_unheld(e["path"]):
                continue
            total -= e["bytes"]
            removed.append(e["path"])
        for path in removed:
            print(f"sweepbench: store over store.max_mb={self.max_bytes / 2**20:g}: removed {path}", flush=True)
        return removed


def _lock(where: Path) -> int:
    """An exclusive flock on ``where``'s lock file, the one in place (an evicted entry's is gone)."""
    while True:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(where / LOCK_FILE).st_ino:
                return fd
        except FileNotFoundError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _remove_unheld(where: Path) -> bool:
    try:
        fd = os.open(where / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        shutil.rmtree(where, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _read_meta(where: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(entry.json, None), (None, None) where there is none, or (None, why it cannot be used)."""
    path = where / ENTRY_FILE
    if not path.exists():
        return None, None
    try:
        if not path.is_file():
            return None, "not a regular file"
        meta = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
    if not isinstance(meta, dict) or not isinstance(meta.get("measured"), dict):
        return None, "not an entry (no 'measured' object)"
    return meta, None


class Entry:
    """One key's entry: what was stored (``value``, ``file``), and ``put`` / ``commit`` to store."""

    def __init__(self, store: Store, where: Path, *, key: dict[str, Any]) -> None:
        self.store, self.where, self.key = store, where, json.loads(json.dumps(key, default=str))
        meta, why = _read_meta(where)
        if why is None and meta is not None and meta.get("key") != self.key:
            why = "its key is not the one it is filed under"
        if why:
            print(f"sweepbench: ignoring store entry {where / ENTRY_FILE} ({why}); measuring again", flush=True)
        usable = meta is not None and not why and (not store.refresh or meta.get("run") == store.run)
        self.meta: dict[str, Any] | None = meta if usable else None

    def value(self, name: str) -> Any:
        """A stored value (None: none, or refreshed)."""
        return self.meta.get(name) if self.meta else None

    @property
    def measured(self) -> dict[str, Any] | None:
        """Where and when the stored values were measured: {"at", "host", "job", "store"}."""
        return self.meta["measured"] if self.meta else None

    def file(self, name: str) -> Path | None:
        return self.where / name if self.meta and (self.where / name).is_file() else None

    def temp_file(self, name: str) -> Path:
        """A fresh temporary in the entry's folder, for ``commit`` to make its ``name``."""
        fd, tmp = tempfile.mkstemp(dir=self.where, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        return Path(tmp)

    def put(
        self, values: dict[str, Any], *, files: dict[str, Path] | None = None, measured: dict[str, Any] | None = None
    ) -> None:
        """Store ``values`` (replacing the entry's), with ``files`` ({name: a written temporary}):
        each renamed into place (record.atomic's pattern without its in-memory copy and fsync:
        GiBs of reference; a torn file fails to load and is measured again), then entry.json."""
        for name, tmp in (files or {}).items():
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.where / name)
        self.meta = {**values, "key": self.key, "run": self.store.run, "measured": measured or self.store.stamp()}
        write_json_atomic(self.where / ENTRY_FILE, self.meta)
        self.store.evict(keep=self.where)


def all_entries(root: Path) -> list[dict[str, Any]]:
    """Every entry under ``root``: {"path", "kind", "bytes", "mtime", "meta" (None: unreadable)}."""
    found: list[dict[str, Any]] = []
    if not root.is_dir():
        return found
    for kind in sorted(p for p in root.iterdir() if p.is_dir()):
        for where in sorted(p for p in kind.iterdir() if p.is_dir()):
            try:
                mtime = (where / ENTRY_FILE).stat().st_mtime
            except OSError:
                mtime = where.stat().st_mtime  # being written, or left by a crash: oldest first
            found.append(
                {"path": where, "kind": kind.name, "bytes": _size(where), "mtime": mtime, "meta": _read_meta(where)[0]}
            )
    return found


def clear(root: Path) -> int:
    """Remove every entry no process holds; how many were removed."""
    return sum(_remove_unheld(e["path"]) for e in all_entries(root))
