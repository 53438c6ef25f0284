"""Entry point: ``python -m sweepbench`` and the ``sweepbench`` console script."""

from __future__ import annotations

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


def main() -> None:
    from sweepbench.report.cli import maybe_run  # `sweepbench report|compare ...`; imported lazily
    if maybe_run():
        return
    register_sweeper()
    store_schemas()
    load_all()
    compose_errors.raise_compose_errors()  # a compose error: one line, exit 2 (sweep.compose_errors says why)
    try:
        _hydra_main()
    except KeyboardInterrupt:  # before any job started (a running local sweep stops on its own)
        print("sweepbench: interrupted", file=sys.stderr)
        sys.exit(130)
    except HydraException as err:
        if not compose_errors.raising():
            raise
        from sweepbench.sweep.errors import error_line, exit_bad_input

        exit_bad_input(error_line(err))
