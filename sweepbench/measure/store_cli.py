"""``sweepbench store list|clear``: what the store of baselines holds, and emptying it.

Wired as ``report`` and ``compare`` are (``sweepbench.report.cli``): ``maybe_run`` is called first
by the entry point and runs the sub-command when the first argument is ``store``."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from sweepbench.measure.store import all_entries, clear, default_dir

COMMAND = "store"
# the key's fields a listing shows (where an entry has them), in this order
SHOWN = (
    "seq_len",
    "batch",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "causal",
    "pattern",
    "device",
    "driver",
    "torch",
    "cudnn",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweepbench store",
        description=(
            "The store of baselines that benchmarks measure before their own timing (attention's T1 and "
            "reference), kept beyond the sweep per shape, device, driver and software. Default folder: "
            "$SWEEPBENCH_STORE_DIR, else $XDG_CACHE_HOME/sweepbench/store (~/.cache/...); a sweep's "
            "store.dir=... names another, store.enabled=false keeps none, store.refresh=true measures afresh, "
            "store.max_mb caps its size."
        ),
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name, what in (
        ("list", "one line per entry: kind, key, when and where measured, size"),
        ("clear", "remove every entry (except those a running job holds)"),
    ):
        p = sub.add_parser(name, help=what, description=what)
        p.add_argument("--dir", type=Path, default=None, help=f"the store's folder (default: {default_dir()})")
    return parser


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _line(e: dict[str, Any]) -> str:
    meta = e["meta"]
    if meta is None:
        when = datetime.fromtimestamp(e["mtime"], timezone.utc).isoformat(timespec="seconds")
        return f"{e['kind']}  {e['path'].name}  unreadable or incomplete (modified {when})  {_size(e['bytes'])}"
    key = meta.get("key") if isinstance(meta.get("key"), dict) else {}
    fields = [k for k in SHOWN if key.get(k) is not None] or [
        k for k, v in key.items() if not isinstance(v, (dict, list))
    ]
    shown = " ".join(f"{k}={key[k]}" for k in fields)
    extra = " ranking" if key.get("ranking") else (f" t1_local={key['t1_local']}" if key.get("t1_local") else "")
    m = meta["measured"]
    return (
        f"{e['kind']}  {e['path'].name}  {shown}{extra}  measured {m.get('at')} on {m.get('host')} "
        f"by {m.get('job') or '-'}  {_size(e['bytes'])}"
    )


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    root = (args.dir or default_dir()).expanduser()
    if root.exists() and not root.is_dir():
        print(f"sweepbench: error: store --dir {root} is not a directory", file=sys.stderr)
        return 2
    entries = all_entries(root)
    if args.action == "list":
        for e in entries:
            print(_line(e))
        print(f"sweepbench store {root}: {len(entries)} entries, {_size(sum(e['bytes'] for e in entries))}")
        return 0
    removed = clear(root)
    held = len(entries) - removed
    print(
        f"sweepbench store {root}: removed {removed} entries ({_size(sum(e['bytes'] for e in entries))} before)"
        + (f"; {held} held by a running job, kept" if held else "")
    )
    return 0


def maybe_run(argv: Sequence[str] | None = None) -> bool:
    """Run ``store ...`` (and exit with its status) if ``argv`` starts with it; else False."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != COMMAND:
        return False
    sys.exit(main(argv[1:]))
