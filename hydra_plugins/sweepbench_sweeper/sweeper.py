"""Hydra sweeper plugin ``hydra/sweeper=sweepbench`` (Hydra requires plugins under hydra_plugins).

The work is in sweepbench.sweep.driver; this class only plugs it into Hydra."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class SweepbenchSweeperConf:
    _target_: str = "hydra_plugins.sweepbench_sweeper.sweeper.SweepbenchSweeper"
    # Saved sweep lists, as Hydra's basic sweeper has them: ``{key: "a,b"}`` (a config file or an
    # experiment sets ``hydra.sweeper.params``); an override of the same key on the CLI wins.
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="sweepbench", node=SweepbenchSweeperConf, provider="sweepbench"
)


class SweepbenchSweeper(Sweeper):
    """A grid sweep like Hydra's basic sweeper, plus: every job validated before any starts, job
    directories named by sweep tag, jobs already done skipped, dry run, aggregated results."""

    def __init__(self, params: Optional[Dict[str, str]] = None) -> None:
        super().__init__()
        self.params: dict[str, str] = dict(params or {})

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        from sweepbench.sweep import compose_errors

        compose_errors.composed()
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def saved_arguments(self) -> list[str]:
        """``hydra.sweeper.params`` as overrides; placed before the CLI's, which win per key."""
        return [f"{key}={value}" for key, value in self.params.items()]

    def sweep(self, arguments: list[str]) -> Any:
        from sweepbench.sweep.driver import run_sweep

        return run_sweep(self, [*self.saved_arguments(), *arguments])
