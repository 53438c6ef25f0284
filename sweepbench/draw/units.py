"""Units as people read them, importable without matplotlib (the driver's summary table uses them)."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """``1048576`` -> ``1 MiB``; powers of two stay exact, others get 3 significant digits."""
    if n <= 0:
        return f"{n:g} B"
    exp = min(int(math.log(n, 1024)), len(_BYTE_UNITS) - 1)
    return f"{n / 1024**exp:.3g} {_BYTE_UNITS[exp]}"


def format_number(x: float) -> str:
    """``57991.9`` -> ``57992``, ``0.012344`` -> ``0.01234``: 4 significant digits, every digit of
    the integer part from 1000 up (no exponent that hides them: ``5.799e+04``), an exponent only
    beyond 1e15 or below 1e-4."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.0f}" if 1000 <= abs(x) < 1e15 else f"{x:.4g}"


def format_time(seconds: float) -> str:
    """``0.00991`` -> ``9.91 ms``: 3 significant digits in s, ms or µs."""
    if not math.isfinite(seconds):
        return str(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
