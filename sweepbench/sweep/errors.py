"""Error text for the one-line ``sweepbench: error:`` messages: Hydra's and OmegaConf's errors
rewritten for a person (no internal ``base_*`` schemas among the choices, no search-path dump,
"did you mean ..." for a typo'd group, option or key)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from typing import NoReturn

_SEARCH_PATH = re.compile(r"\s*Config search path:.*$", re.S)
_MISSING_OPTION = re.compile(
    r"Could not find '(?P<group>[^']+)/(?P<option>[^']+)'\s*Available options in '[^']+':\s*(?P<opts>.*)$", re.S
)
_BAD_KEY = re.compile(r"Could not override '(?P<key>[^']+)'\..*?Key '(?P<leaf>[^']+)' not in '(?P<node>[^']+)'", re.S)


def exit_bad_input(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"sweepbench: error: {line}", file=sys.stderr)
    sys.exit(2)


def _close(word: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = _close(word, choices)
    return f"; did you mean {close}?" if close else ""


def _schema_keys() -> dict[str, list[str]]:
    """Field names of every config schema, by class name (as OmegaConf names a node)."""
    from sweepbench.benchmarks.registry import _BENCHMARKS, load_all
    from sweepbench.config import schema

    load_all()
    classes = [c for c in vars(schema).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    classes += [b.schema for b in _BENCHMARKS.values()]
    return {c.__name__: [f.name for f in dataclasses.fields(c)] for c in classes}


def _rewrite(text: str) -> str:
    text = _SEARCH_PATH.sub("", text)
    missing = _MISSING_OPTION.search(text)
    if missing:
        group, option = missing["group"], missing["option"]
        options = [o for o in missing["opts"].split() if not o.startswith("base_")]
        return f"{group}={option} is not an option of {group}{_did_you_mean(option, options)} (valid: {', '.join(options)})"
    bad = _BAD_KEY.search(text)
    if bad:
        key, leaf = bad["key"], bad["leaf"]
        keys = _schema_keys().get(bad["node"], [])
        parent = key.rpartition(".")[0]
        close = _close(leaf, keys)
        if close:
            return f"unknown key {key}: did you mean {parent + '.' if parent else ''}{close}?"
        valid = f"valid keys{' of ' + parent if parent else ''}: {', '.join(keys)}; " if keys else ""
        return f"unknown key {key} ({valid}+{key}=... adds a new key)"
    return text


def error_line(err: BaseException) -> str:
    """The error's message and, for Hydra's wrapped OmegaConf errors, its cause's first line."""
    text = str(err)
    cause = str(err.__cause__ or "").strip()
    if cause:
        text += f" ({cause.splitlines()[0]})"
    return _rewrite(text)
