"""Entry point: ``python -m sweepbench`` and the ``sweepbench`` console script."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig

from sweepbench.benchmarks.registry import load_all
from sweepbench.config.store import store_schemas
from sweepbench.sweep import compose_errors


def config_source() -> str:
    """Where the config groups are: those that came with the imported code. A wheel ships
    ``conf/`` as the package ``sweepbench.conf`` (``sweepbench/conf/``); a checkout links
    ``sweepbench/conf`` to its top-level ``conf/`` (an editable install, ``python -m sweepbench``
    typed in the clone, or PYTHONPATH pointing at it), and a copy that dropped the link still has
    the top-level ``conf/``. Asking the import system for ``sweepbench.conf`` instead would find an
    editable install's ``conf/`` even while this code runs from another checkout."""
    here = Path(__file__).resolve().parent
    if (here / "conf" / "config.yaml").is_file():
        return "pkg://sweepbench.conf"
    checkout = here.parent / "conf"
    if (checkout / "config.yaml").is_file():
        return str(checkout)
    return "pkg://sweepbench.conf"  # Hydra then says what is missing


@hydra.main(version_base="1.3", config_path=config_source(), config_name="config")
def _hydra_main(cfg: DictConfig) -> dict[str, Any] | None:
    from sweepbench.job import run

    return run(cfg)


def register_sweeper() -> None:
    """Register the sweeper and the SLURM launchers with Hydra explicitly: Hydra finds plugins by
    walking the hydra_plugins folders, which an editable install does not expose to that walk.
    The modules are imported before Plugins.instance() scans, so that a scan that does see them
    (the repository on sys.path) re-executes them in place rather than loading them anew."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.sweepbench_sweeper.slurm_launcher import (
        SweepbenchSlurmLauncher,
        SweepbenchSubmititLocalLauncher,
    )
    from hydra_plugins.sweepbench_sweeper.sweeper import SweepbenchSweeper

    plugins = Plugins.instance()
    for plugin in (SweepbenchSweeper, SweepbenchSlurmLauncher, SweepbenchSubmititLocalLauncher):
        plugins.register(plugin)


GROUPS = ("benchmark", "model", "parallelism", "backend", "mode", "experiment")
HELP_FLAGS = ("--help", "-h")


def _conf_dir() -> Path:
    here = Path(__file__).resolve().parent
    return here / "conf" if (here / "conf" / "config.yaml").is_file() else here.parent / "conf"


def group_options(group: str) -> list[str]:
    """The options a user picks in a config group: its YAML files (``base_*``, the schemas the
    options extend, are internal)."""
    folder = _conf_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("base_"))


def _summary_line(group: str, option: str) -> str:
    """The first sentence of an option's YAML comment: what it is."""
    words: list[str] = []
    for line in (_conf_dir() / group / f"{option}.yaml").read_text().splitlines():
        if not line.startswith("# ") or line.startswith(("#  ", "# @package")):
            if words:
                break
            continue
        words.append(line[2:].strip())
        if words[-1].endswith("."):
            break
    return " ".join(words)


def help_page() -> str:
    benchmarks = "\n".join(f"  {name:<11} {_summary_line('benchmark', name)}" for name in group_options("benchmark"))
    groups = "\n".join(f"  {g}: {', '.join(group_options(g))}" for g in GROUPS[1:])
    return f"""sweepbench: distributed PyTorch benchmarks composed from config groups, swept locally or on SLURM

usage:
  python -m sweepbench [group=option ...] [key=value ...]   one job (default: refit of the tiny model, tp2 -> tp1)
  python -m sweepbench -m parallelism=tp2,tp4 [...]         a sweep: one job per combination of the listed values
  python -m sweepbench -m ... sweep.dry_run=true            list every job, its command and whether it fits here;
                                                            start nothing
  python -m sweepbench -m ... hydra/launcher=slurm          submit the jobs to SLURM (docs/slurm.md)
  sweepbench report SWEEP_DIR [--wandb]                     the sweep's report.html (and a wandb workspace view)
  sweepbench compare BASELINE CANDIDATE [--fail-on-regression]   faster, slower or unchanged, and is the gap real
  sweepbench store list|clear [--dir DIR]                   the kept baselines (attention's T1): list or remove

benchmarks (benchmark=NAME):
{benchmarks}

config groups (group=option):
{groups}

switches: sweep.repeats=N (fresh processes per round), sweep.on_unfit=skip|refuse (jobs that do not fit),
  sweep.force=true (rerun jobs already ok), backend=auto|gloo|nccl, launch.timeout_s=S, fault.kind=...,
  store.refresh=true (measure baselines afresh), store.enabled=false, store.dir=DIR, store.max_mb=MiB
  Any key of the composed config can be overridden (key=value); --cfg job prints it.

docs: README.md, docs/running.md (every switch), docs/slurm.md, docs/reports.md, docs/benchmarks/
Hydra's own help: --hydra-help"""


def check_internal_choices(argv: list[str]) -> None:
    """``benchmark=base_refit`` and the like name a schema, not an option: one line, exit 2."""
    from sweepbench.sweep.errors import exit_bad_input

    for arg in argv:
        key, eq, value = arg.lstrip("+~").partition("=")
        if not eq or key not in GROUPS:
            continue
        for choice in value.split(","):
            if choice.strip().startswith("base_"):
                exit_bad_input(
                    f"{key}={choice.strip()} is an internal schema, not a {key}; choose one of "
                    f"{', '.join(group_options(key))}"
                )


_early_signal: list[int] = []


def _stop_early(signum: int, frame: object) -> None:
    """SIGTERM before a local sweep's own handlers: stop as Ctrl-C does (KeyboardInterrupt)."""
    _early_signal.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    from sweepbench.measure.store_cli import maybe_run as maybe_store  # `sweepbench store list|clear`
    from sweepbench.report.cli import maybe_run  # `sweepbench report|compare ...`; imported lazily

    if maybe_run() or maybe_store():
        return
    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
        print(help_page())
        return
    check_internal_choices(sys.argv[1:])
    # until a local sweep installs its own handlers (launch.interrupt), SIGTERM stops it as Ctrl-C does;
    # and Ctrl-C stops it even where it started with SIGINT ignored (a background job of a shell
    # script inherits that), as it does once those handlers are in place
    signal.signal(signal.SIGTERM, _stop_early)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    register_sweeper()
    store_schemas()
    load_all()
    compose_errors.raise_compose_errors()  # a compose error: one line, exit 2 (sweep.compose_errors says why)
    try:
        _hydra_main()
    except KeyboardInterrupt:  # before any job started (a running local sweep stops on its own)
        signum = _early_signal[0] if _early_signal else signal.SIGINT
        print(f"sweepbench: interrupted by {signal.Signals(signum).name} before any job started", file=sys.stderr)
        sys.exit(128 + signum)
    except HydraException as err:
        if not compose_errors.raising():
            raise
        from sweepbench.sweep.errors import error_line, exit_bad_input

        exit_bad_input(error_line(err))
