"""Units as people read them, importable without matplotlib (the driver's summary table uses them)."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """``1048576`` -> ``1 MiB``; powers of two stay exact, others get 3 significant digits."""
    if n <= 0:
        return f"{n:g} B"
    exp = min(int(math.log(n, 1024)), len(_BYTE_UNITS) - 1)
    return f"{n / 1024 ** exp:.3g} {_BYTE_UNITS[exp]}"
