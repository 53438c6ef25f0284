"""One wandb run per job, from the process that records the job (rank 0's host).

Offline by default. Whatever wandb does (no network, a bad key, a crash of its service), the
benchmark's local files are still written: every wandb call is guarded, and a failure only lands
in ``wandb_error``. ``NullRun`` has the same methods for ``wandb.mode=disabled`` (nanochat's
DummyWandb idea)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class NullRun:
    """Stands in for a wandb run when wandb is disabled or could not start."""

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.dir: str | None = None

    def log_cases(self, cases: list[dict[str, Any]]) -> None:
        pass

    def log_summary(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, *, failed: bool) -> None:
        pass


class WandbRun(NullRun):
    def __init__(self, run: Any) -> None:
        super().__init__()
        self._run = run
        self.dir = str(Path(run.dir).parent)  # .../wandb/offline-run-*/ (holds the .wandb log)

    def log_cases(self, cases: list[dict[str, Any]]) -> None:
        """One history step per measured case, so wandb can plot e.g. busbw over size."""
        try:
            for case in cases:
                self._run.log({k: v for k, v in flatten(case).items() if not isinstance(v, list)})
        except Exception as err:
            self.error = f"wandb log: {err}"
            log.warning(self.error)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        try:
            for key, value in flatten(metrics).items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    self._run.summary[key] = value
        except Exception as err:  # never let wandb fail a benchmark
            self.error = f"wandb summary: {err}"
            log.warning(self.error)

    def finish(self, *, failed: bool) -> None:
        try:
            self._run.finish(exit_code=1 if failed else 0)
        except Exception as err:
            self.error = f"wandb finish: {err}"
            log.warning(self.error)


def start_run(cfg: DictConfig, *, job_dir: Path, tag: str, group: str, config: dict[str, Any]) -> NullRun:
    """A wandb run named ``tag`` in ``group``; WANDB_MODE in the environment wins over wandb.mode."""
    mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
    if mode == "disabled":
        return NullRun()
    try:
        import wandb

        run = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            group=group,
            name=tag,
            job_type=cfg.benchmark.name,
            tags=list(cfg.wandb.tags),
            config=flatten(config),
            dir=str(job_dir),
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(init_timeout=cfg.wandb.init_timeout_s, console="off",
                                    x_disable_stats=True, silent=True),
        )
        return WandbRun(run)
    except Exception as err:
        message = f"wandb init ({mode}): {type(err).__name__}: {err}"
        log.warning("%s; results are still written locally", message)
        return NullRun(error=message)
