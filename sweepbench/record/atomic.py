"""Atomic file writes: readers see the old file or the whole new one, never half of it. Files get
the usual mode (0666 less the umask, 0644 typically, as logs have), not mkstemp's 0600, so that
teammates on a shared disk can read results."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_pattern(name_glob: str) -> str:
    """The glob of the temporaries :func:`write_atomic` leaves behind when killed mid-write, for
    files whose names match ``name_glob``."""
    return f".{name_glob}.*.tmp"


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary beside it. An OSError (a full disk, a
    read-only directory) names ``path``, not the temporary, and leaves no temporary behind."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # temp_pattern's names
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any | None:
    """The file's JSON, or None if it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
