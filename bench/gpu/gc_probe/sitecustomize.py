"""Put this folder on PYTHONPATH with GC_PROBE=<file prefix> to log every garbage collection that
takes over 2 ms, or of the oldest generation, to <prefix>.<pid> (wall time, generation, pause).
GC_PROBE_KEEP_ON=1 also undoes the timing loop's GC guard (sweepbench.measure.timing keeps the
collector off while timing): the harness as it was before that guard, for an A/B in one call
(bench/gpu/peers_interleaved.sh, docs/results/peers_1gpu_h100/README.md)."""

import gc
import os
import sys
import time

if os.environ.get("GC_PROBE"):
    _log = open(f"{os.environ['GC_PROBE']}.{os.getpid()}", "w", buffering=1)
    _start = [0.0]

    def _callback(phase: str, info: dict) -> None:
        if phase == "start":
            _start[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - _start[0]) * 1e3
        if ms > 2 or info["generation"] == 2:
            _log.write(f"{time.time():.3f} gen{info['generation']} {ms:.1f} ms collected={info['collected']}\n")

    gc.callbacks.append(_callback)

    if os.environ.get("GC_PROBE_KEEP_ON"):
        _disable, _collect = gc.disable, gc.collect

        def _from_timing() -> bool:
            return sys._getframe(2).f_globals.get("__name__") == "sweepbench.measure.timing"

        def disable() -> None:
            if not _from_timing():
                _disable()

        def collect(*args, **kwargs) -> int:
            return 0 if _from_timing() else _collect(*args, **kwargs)

        gc.disable, gc.collect = disable, collect
