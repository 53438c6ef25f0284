"""What identifies a measured case inside a job, for any benchmark: its non-measured fields.

A case dict mixes what was measured (floats: times, rates) with what the case is (strings,
integers, booleans: op, size, strategy, case name). The identity is the second part, so the same
case of the same config gets the same key in two sweeps, and labels only show what varies
between the cases of a job."""

from __future__ import annotations

from typing import Any, Sequence

from sweepbench.draw.units import format_bytes

# scalar fields that vary between runs of one case, or that are settings rather than identity
# (samples_recorded: how many samples a case held before a report thinned them, report.load)
_NOT_IDENTITY = frozenset({"warmup", "iters", "verified", "plan_digest", "routes", "samples_recorded"})
# where a case's baseline came from (measured by this job, or reused from the store) is not what the
# case is: a sweep with a cold store and its rerun with a warm one compare case by case
_PROVENANCE = frozenset({"t1_reused", "reference_reused", "total_from"})


def case_identity(case: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Sorted (key, value) pairs of the case's identifying fields."""
    if "case" in case:  # a benchmark that names its cases
        return (("case", case["case"]),)
    return tuple(
        sorted(
            (k, v)
            for k, v in case.items()
            if k not in _NOT_IDENTITY
            and k not in _PROVENANCE
            and not k.endswith("_note")  # prose about a field, which may be reworded between versions
            and isinstance(v, (str, int, bool))
            and not isinstance(v, float)
        )
    )


def _show(key: str, value: Any) -> str:
    if key.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        return format_bytes(value)
    return str(value)


def case_labels(cases: Sequence[dict[str, Any]]) -> list[str]:
    """A short label per case: the identity fields that differ between the job's cases."""
    idents = [dict(case_identity(c)) for c in cases]
    if len(idents) <= 1:
        only = idents[0] if idents else {}
        return [str(only.get("case") or only.get("op") or only.get("strategy") or "all")] * len(idents)
    keys = [k for k in idents[0] if len({repr(i.get(k)) for i in idents}) > 1]
    # a size in bytes is implied by a named field that varies with it: keep the shortest label
    named = [k for k in keys if not k.endswith("_bytes")]
    if named and len({tuple(i.get(k) for k in named) for i in idents}) == len(idents):
        keys = named
    return [" ".join(_show(k, i.get(k)) for k in keys) or f"case {n}" for n, i in enumerate(idents)]
