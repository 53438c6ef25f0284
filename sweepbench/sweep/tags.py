"""Sweep tags, in the spirit of fairseq2's SweepTagger.

A tag is ``tag_format`` (default
``{benchmark}{detail}_{model}_{parallelism}_{backend}_{mode}_ws{world_size}_{hash}``) filled with the
chosen group options, the world size, ``detail`` (the values of the benchmark's ``tag_keys``, each
behind a ``-``, e.g. ``-tp1-broadcast`` for refit's inference layout and strategy) and ``hash``: the first 8 hex digits of the
SHA-256 of the resolved job config without its output-only keys (hydra, wandb, launch, sweep).
Same config -> same tag in any sweep; any difference -> a different hash. Characters outside
``[A-Za-z0-9._=-]`` become ``-``; the readable part is cut so the tag stays within ``tag_max_len``."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweepbench.config.schema import OUTPUT_ONLY_KEYS

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")
HASH_LEN = 8


def tagged_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config a tag identifies: everything but the output-only keys."""
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return {k: v for k, v in container.items() if k not in OUTPUT_ONLY_KEYS}


def config_hash(cfg: DictConfig) -> str:
    blob = json.dumps(tagged_config(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def make_tag(cfg: DictConfig, *, world_size: int) -> str:
    from sweepbench.benchmarks.registry import get_benchmark

    keys = get_benchmark(cfg.benchmark.name).tag_keys
    fields = {
        "benchmark": cfg.benchmark.name,
        "detail": "".join(f"-{cfg.benchmark[k]}" for k in keys),
        "model": cfg.model.name,
        "parallelism": cfg.parallelism.name,
        "backend": cfg.backend.name,
        "mode": cfg.mode.name,
        "world_size": world_size,
        "hash": "{hash}",  # filled after sanitising and cutting, so it always survives whole
    }
    try:
        readable = cfg.sweep.tag_format.format(**fields)
    except (KeyError, IndexError) as err:
        raise ValueError(f"sweep.tag_format={cfg.sweep.tag_format!r} uses unknown field {err}; "
                         f"valid fields: {', '.join(fields)}") from None
    if "{hash}" not in readable:
        raise ValueError(f"sweep.tag_format={cfg.sweep.tag_format!r} must contain {{hash}}")
    head, _, tail = readable.partition("{hash}")
    head, tail = _UNSAFE.sub("-", head), _UNSAFE.sub("-", tail)
    room = cfg.sweep.tag_max_len - HASH_LEN - len(tail)
    if room < 0:
        raise ValueError(f"sweep.tag_max_len={cfg.sweep.tag_max_len} is too short for the tag's fixed "
                         f"part; use at least {HASH_LEN + len(tail)}")
    return head[:room] + config_hash(cfg) + tail
