"""Sweep tags, in the spirit of fairseq2's SweepTagger.

A tag is ``tag_format`` (default
``{benchmark}{detail}_{model}_{parallelism}_{backend}_{mode}_ws{world_size}_{hash}``) filled with the
chosen group options (only the groups the benchmark's ``tag_groups`` declare: a group that means
nothing to it is left out with its separator), the world size, ``detail`` (the values of the
benchmark's ``tag_keys``, each behind a ``-``, e.g. ``-tp1-broadcast`` for refit's inference
layout and strategy, then ``-py=<env>`` when ``launch.python`` is set), ``python`` (that env's
name) and ``hash``: the first 8 hex digits of the SHA-256 of the resolved job config without its
output-only keys (hydra, wandb, launch, sweep), but with ``launch.python`` when set (the
interpreter changes what is measured).
Same config -> same tag in any sweep; any difference -> a different hash. Characters outside
``[A-Za-z0-9._=-]`` become ``-``; the readable part is cut so the tag stays within ``tag_max_len``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from sweepbench.config.schema import OUTPUT_ONLY_KEYS

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")
HASH_LEN = 8


GROUPS = ("model", "parallelism", "backend", "mode")
_OMITTED = "\0"


def tagged_container(container: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config (plain containers) a tag identifies."""
    tagged = {k: v for k, v in container.items() if k not in OUTPUT_ONLY_KEYS}
    python = (container.get("launch") or {}).get("python")
    if python:
        tagged["launch"] = {"python": python}
    return tagged


def tagged_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config a tag identifies: everything but the output-only keys."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return tagged_container(cast(dict[str, Any], container))  # a config's keys are strings


def hash_of(tagged: dict[str, Any]) -> str:
    blob = json.dumps(tagged, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def config_hash(cfg: DictConfig) -> str:
    return hash_of(tagged_config(cfg))


def python_name(python: str) -> str:
    """A short name for an interpreter: its venv's folder (``/envs/torch29/bin/python`` ->
    ``torch29``), else its file name."""
    path = Path(python)
    return path.parent.parent.name if path.parent.name == "bin" and path.parent.parent.name else path.name


def _drop_omitted(text: str) -> str:
    """Remove each omitted field together with one separator next to it."""
    text = re.sub(rf"[_.-]?{_OMITTED}", "", text) if not text.startswith(_OMITTED) else text
    return re.sub(rf"{_OMITTED}[_.-]?", "", text)


def make_tag(cfg: DictConfig, *, world_size: int) -> str:
    from sweepbench.benchmarks.registry import get_benchmark

    bench = get_benchmark(cfg.benchmark.name)
    python = python_name(cfg.launch.python) if cfg.launch.python else ""
    fields = {
        "benchmark": cfg.benchmark.name,
        "detail": "".join(f"-{cfg.benchmark[k]}" for k in bench.tag_keys) + (f"-py={python}" if python else ""),
        **{g: (cfg[g].name if g in bench.tag_groups else _OMITTED) for g in GROUPS},
        "world_size": world_size,
        "python": python,
        "hash": "{hash}",  # filled after sanitising and cutting, so it always survives whole
    }
    try:
        readable = _drop_omitted(cfg.sweep.tag_format.format(**fields))
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"sweep.tag_format={cfg.sweep.tag_format!r} uses unknown field {err}; valid fields: {', '.join(fields)}"
        ) from None
    if "{hash}" not in readable:
        raise ValueError(f"sweep.tag_format={cfg.sweep.tag_format!r} must contain {{hash}}")
    head, _, tail = readable.partition("{hash}")
    head, tail = _UNSAFE.sub("-", head), _UNSAFE.sub("-", tail)
    room = cfg.sweep.tag_max_len - HASH_LEN - len(tail)
    if room < 0:
        raise ValueError(
            f"sweep.tag_max_len={cfg.sweep.tag_max_len} is too short for the tag's fixed "
            f"part; use at least {HASH_LEN + len(tail)}"
        )
    return head[:room] + config_hash(cfg) + tail


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def check_not_collapsed(first: DictConfig, second: DictConfig) -> None:
    """Two jobs of a grid with the same tag: the same job twice (kept once), unless their configs
    differ where a tag does not look (the output-only keys: launch, sweep, wandb): a swept
    ``launch.keep_ranks=true,false`` or ``sweep.repeats=1,3`` would silently run as one job with
    one of its values. ValueError (one line) naming the key and its values."""
    a = _flat(OmegaConf.to_container(first, resolve=True))
    b = _flat(OmegaConf.to_container(second, resolve=True))
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if differ:
        key = differ[0]
        raise ValueError(
            f"{key} is swept ({json.dumps(a.get(key))}, {json.dumps(b.get(key))}), but it is a setting of how jobs run, not "
            f"of what they measure: the jobs would be one, run with one of its values; "
            f"run one sweep per value"
        )
