"""Counting who reads a sweep's job records: a ``sitecustomize.py`` that every Python process of a
sweep imports (its folder leads PYTHONPATH, which the driver's ranks and fork server inherit),
whose audit hook (``sys.addaudithook``) counts each ``open`` for reading of a file named
metrics.json, per path (a forked process starts a count of its own). Each process keeps its
counts in a file of its own, ``<pid>.json`` (with its parent's pid), rewritten as they change
rather than only at exit: a rank forked from the fork server leaves by ``os._exit``, which runs
no exit handler."""

from __future__ import annotations

import json
import os
from pathlib import Path

SITECUSTOMIZE = '''
import json
import os
import sys

_OUT = os.environ.get("SWEEPBENCH_READS_DIR")
_counts = {}


def _count_reads(event, args):
    if event != "open" or not args or isinstance(args[0], int):
        return
    path = os.fsdecode(args[0])
    if os.path.basename(path) != "metrics.json" or args[2] & os.O_ACCMODE != os.O_RDONLY:
        return
    key = os.path.abspath(path) + ("" if os.path.exists(path) else " (missing)")
    _counts[key] = _counts.get(key, 0) + 1
    note = json.dumps({"ppid": os.getppid(), "reads": _counts}).encode()
    try:
        fd = os.open(os.path.join(_OUT, f"{os.getpid()}.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, note)
        os.close(fd)
    except OSError as err:  # the count goes on; the sweep must not fail for it
        print(f"read counter: {err}", file=sys.stderr)


if _OUT:
    os.register_at_fork(after_in_child=_counts.clear)  # a forked process counts its own reads
    sys.addaudithook(_count_reads)
'''


def counting_env(folder: Path) -> dict[str, str]:
    """Environment entries under which every Python process of a sweep counts its reads of
    metrics.json into ``folder/reads`` (the hook lives in ``folder/hook``)."""
    (folder / "hook").mkdir(parents=True, exist_ok=True)
    (folder / "reads").mkdir(parents=True, exist_ok=True)
    (folder / "hook" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(folder / "hook"), os.environ.get("PYTHONPATH", "")]))
    return {"PYTHONPATH": path, "SWEEPBENCH_READS_DIR": str(folder / "reads")}


def read_counts(folder: Path) -> dict[int, dict]:
    """pid -> {"ppid": its parent's pid, "reads": {path: opens for reading}} of every process
    that opened a metrics.json (a path that did not exist then ends in `` (missing)``)."""
    return {int(p.stem): json.loads(p.read_text()) for p in sorted((folder / "reads").glob("*.json"))}
