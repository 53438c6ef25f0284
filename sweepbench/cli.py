"""Entry point: ``python -m sweepbench`` and the ``sweepbench`` console script."""

from __future__ import annotations

from typing import Any

import hydra
from omegaconf import DictConfig

from sweepbench.benchmarks.registry import load_all
from sweepbench.config.store import store_schemas


@hydra.main(version_base="1.3", config_path="pkg://sweepbench.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> dict[str, Any]:
    from sweepbench.job import run

    return run(cfg)


def register_sweeper() -> None:
    """Register the sweeper with Hydra explicitly: Hydra finds plugins by walking the
    hydra_plugins folders, which an editable install does not expose to that walk."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.sweepbench_sweeper.sweeper import SweepbenchSweeper

    Plugins.instance().register(SweepbenchSweeper)


def main() -> None:
    register_sweeper()
    store_schemas()
    load_all()
    _hydra_main()
