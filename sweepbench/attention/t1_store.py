"""T1 and the single-device reference in the store of baselines (``sweepbench.measure.store``),
kind ``attention-t1``: measured once per key, reused by any later job, sweep or round with it.

The key holds everything they depend on: the shape, dtype, mask and pattern, the seed of the
inputs, T1's iterations and candidates, the device's name and driver and the software (torch,
CUDA, cuDNN; on a CPU its thread count). Beside each entry of T1 (``t1``: {"stats", "refused", "pruned",
"times_s"}; ``reference.pt``), entries of their own hold T1 at the per-GPU length of a backend
(``t1_local_s``) and each shape's ranking of the backends by length (``lengths``: what
``prune`` reads to leave out a backend that lost clearly at a shorter length)."""

from __future__ import annotations

import math
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from sweepbench.measure.store import Entry, Store

KIND = "attention-t1"
REFERENCE = "reference.pt"
# a backend is left out at length L when, at the longest shorter length of the same shape, its median
# was above PRUNE_FACTOR x the best's and its fastest sample slower than the best's slowest
PRUNE_RULE = (
    "left out at this length: at {shorter} tokens its median {median:.4g} s was {ratio:.2f}x the best's "
    "({best} {best_median:.4g} s; > factor {factor:g}) and its fastest sample {low:.4g} s slower than "
    "the best's slowest {best_high:.4g} s"
)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}".strip()


def software_key(device: torch.device) -> dict[str, Any]:
    """The device's name and driver and the software versions that T1 and the reference depend on."""
    from sweepbench.record.env import gpu_info

    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else _cpu_name(),
        "driver": gpu_info()["driver"] if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None,
        # the CPU kernels' threads (a rank gets the cores / its node's ranks); a GPU's T1 does not depend
        # on them, so that a cp1 and a cp2 job of one length share it
        "num_threads": None if cuda else torch.get_num_threads(),
    }


@contextmanager
def t1_entry(store: Store | None, key: dict[str, Any]) -> Iterator["T1Entry | None"]:
    """The key's entry, held for this job alone until the block ends (None without a store)."""
    if store is None:
        yield None
        return
    with store.entry(KIND, key) as entry:
        yield T1Entry(entry)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _valid_t1(t1: Any) -> bool:
    """Whether a stored T1 has the fields the runner reads, with positive finite times."""
    if not (
        isinstance(t1, dict)
        and isinstance(t1.get("stats"), dict)
        and isinstance(t1.get("refused"), dict)
        and isinstance(t1.get("pruned", {}), dict)
        and isinstance(t1.get("times_s", {}), dict)
    ):
        return False
    stats_ok = all(isinstance(s, dict) and _positive(s.get("median_s")) for s in t1["stats"].values())
    times_ok = all(
        isinstance(ts, list) and ts and all(_positive(x) for x in ts) for ts in t1.get("times_s", {}).values()
    )
    return stats_ok and times_ok


class T1Entry:
    """T1, the reference and the values stored beside them, in one store entry."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry

    @property
    def measured(self) -> dict[str, Any] | None:
        """Where and when the entry's values were measured (``measure.store.Entry.measured``)."""
        return self.entry.measured

    def t1(self) -> dict[str, Any] | None:
        """{"stats": {backend: stats}, "refused": {backend: why}, ...} as an earlier job measured it."""
        t1 = self.entry.value("t1")
        if t1 is not None and not _valid_t1(t1):
            print(
                f"sweepbench: ignoring store entry {self.entry.where} (its t1 is not T1's); measuring again", flush=True
            )
            return None
        return t1

    def value(self, name: str) -> Any:
        return self.entry.value(name)

    def put(self, name: str, value: Any) -> None:
        """Store a value for later jobs (an entry of its own key, without a reference)."""
        self.entry.put({name: value})

    def reference(self, device: torch.device, *, like: list[torch.Tensor] | None = None) -> list[torch.Tensor] | None:
        """The stored reference (None: none, or unusable: unreadable, or not shaped as ``like``)."""
        path = self.entry.file(REFERENCE)
        if path is None:
            return None
        try:
            ref = torch.load(path, map_location=device, weights_only=True, mmap=True)
        except Exception as err:  # noqa: BLE001 - torn by a crash, another torch, hostile: measured again
            print(f"sweepbench: ignoring store file {path} ({type(err).__name__}); measuring again", flush=True)
            return None
        if not isinstance(ref, list) or not all(isinstance(x, torch.Tensor) for x in ref):
            print(f"sweepbench: ignoring store file {path} (not a list of tensors); measuring again", flush=True)
            return None
        if like is not None and [(x.shape, x.dtype) for x in ref] != [(x.shape, x.dtype) for x in like]:
            print(
                f"sweepbench: ignoring store file {path} (tensors not shaped as this case's output and "
                f"gradients); measuring again",
                flush=True,
            )
            return None
        return ref

    def save(
        self, t1: dict[str, Any], reference: list[torch.Tensor], *, measured: dict[str, Any] | None = None
    ) -> None:
        """T1 and the reference (written to a temporary, renamed into place, then entry.json), said
        to be ``measured`` then and there (default: now, here)."""
        import torch.utils.serialization as serialization

        tmp = self.entry.temp_file(REFERENCE)
        crc = serialization.config.save.compute_crc32
        try:
            serialization.config.save.compute_crc32 = False  # torch.load does not read it; GiBs cost seconds
            with open(tmp, "wb") as f:
                torch.save([x.detach().cpu() for x in reference], f)
            self.entry.put({"t1": t1}, files={REFERENCE: tmp}, measured=measured)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            serialization.config.save.compute_crc32 = crc


def prune(lengths: dict[str, Any] | None, *, seq_len: int, candidates: list[str], factor: float) -> dict[str, str]:
    """{backend: why} of the candidates that lost clearly at the longest length below ``seq_len``
    this shape was measured at (``PRUNE_RULE``), or were left out there already (a backend left out
    once stays out at every longer length); {} with ``factor`` 0 or nothing shorter."""
    if not factor or not isinstance(lengths, dict):
        return {}
    shorter = [int(n) for n in lengths if n.isdigit() and int(n) < seq_len and isinstance(lengths[n], dict)]
    if not shorter:
        return {}
    at = max(shorter)
    stats = {
        b: s
        for b, s in lengths[str(at)].items()
        if isinstance(s, dict) and all(isinstance(s.get(k), (int, float)) for k in ("median_s", "min_s", "max_s"))
    }
    why = {}
    for b in candidates:  # left out there too: out here (even where one backend was left to time there)
        left_out = lengths[str(at)].get(b)
        if isinstance(left_out, dict) and isinstance(left_out.get("pruned"), str):
            why[b] = f"left out since {at} tokens, where it was {left_out['pruned'][:400]}"
    if len(stats) < 2:
        return why
    best = min(stats, key=lambda b: stats[b]["median_s"])
    b0 = stats[best]
    for b in candidates:
        s = stats.get(b)
        if b in why or b == best or s is None:
            continue
        ratio = s["median_s"] / b0["median_s"]
        if ratio > factor and s["min_s"] > b0["max_s"]:
            why[b] = PRUNE_RULE.format(
                shorter=at,
                median=s["median_s"],
                ratio=ratio,
                best=best,
                best_median=b0["median_s"],
                factor=factor,
                low=s["min_s"],
                best_high=b0["max_s"],
            )
    return why


def measured_note(measured: dict[str, Any] | None) -> str:
    """'measured <when> on <host> by <job>': where a reused value comes from."""
    if not measured:
        return "measured by this job"
    return f"reused: measured {measured.get('at')} on {measured.get('host')} by {measured.get('job') or 'a job'}"
