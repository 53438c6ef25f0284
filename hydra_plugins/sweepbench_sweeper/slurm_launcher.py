"""Hydra launcher plugins ``hydra/launcher=sweepbench_slurm`` and ``sweepbench_submitit_local``
(presets: ``conf/hydra/launcher/slurm.yaml``, ``slurm_local.yaml``).

Their configs extend hydra-submitit-launcher's ``submitit_slurm`` / ``submitit_local``, but one
executor config per sweep does not fit jobs of different world sizes, so these launchers compute
each job's own request (sweepbench.slurm.request) and never raise for a job that died
(sweepbench.slurm.submit). The classes subclass Hydra's core Launcher only: Hydra's plugin
scan re-executes modules under hydra_plugins, which can leave a class imported from another
plugin module stale. No ``from __future__ import annotations`` here: the scan executes this
module before it is in sys.modules, where dataclasses cannot resolve string annotations."""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
from omegaconf import DictConfig, OmegaConf


@dataclass
class SweepbenchSlurmConf(SlurmQueueConf):
    """submitit_slurm's fields, plus sweepbench's. Per job, sweepbench sets nodes, tasks_per_node
    (= ranks per node), gpus_per_node and, unless set here, timeout_min."""

    _target_: str = "hydra_plugins.sweepbench_sweeper.slurm_launcher.SweepbenchSlurmLauncher"
    nodes: Optional[int] = None  # computed per job: leave unset
    tasks_per_node: Optional[int] = None  # computed per job: leave unset
    gpus_per_node: Optional[int] = None  # your nodes' GPUs (when launch.gpus_per_node is 0); None: CPU
    timeout_min: Optional[int] = None  # None: launch.timeout_s in minutes + startup_min
    startup_min: int = 2  # time limit margin for starting the job's ranks
    srun_args: List[str] = field(default_factory=lambda: ["--kill-on-bad-exit=1"])  # a dead rank ends its job
    requeue: bool = True  # sbatch --requeue: preempted / requeued jobs run again
    poll_s: float = 5.0  # how often the driver checks its jobs (one squeue and one sacct call)


@dataclass
class SweepbenchSubmititLocalConf(LocalQueueConf):
    """The same launch through submitit's local executor (one node, no SLURM): to try a sweep's
    SLURM path on a workstation."""

    _target_: str = "hydra_plugins.sweepbench_sweeper.slurm_launcher.SweepbenchSubmititLocalLauncher"
    nodes: Optional[int] = None
    tasks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    timeout_min: Optional[int] = None
    startup_min: int = 2
    poll_s: float = 1.0


ConfigStore.instance().store(
    group="hydra/launcher", name="sweepbench_slurm", node=SweepbenchSlurmConf, provider="sweepbench"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="sweepbench_submitit_local", node=SweepbenchSubmititLocalConf, provider="sweepbench"
)


class SweepbenchSlurmLauncher(Launcher):
    """One SLURM task per rank, each job with its own request; see the module docstring."""

    cluster = "slurm"

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for k, v in params.items()
        }
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from sweepbench.slurm.submit import launch_jobs

        return launch_jobs(self, job_overrides, initial_job_idx)

    def describe(self, job_overrides: Sequence[Sequence[str]]) -> None:
        """sweep.dry_run=true: print each job's request and submission script."""
        from sweepbench.slurm.submit import describe_jobs

        describe_jobs(self, job_overrides)


class SweepbenchSubmititLocalLauncher(SweepbenchSlurmLauncher):
    cluster = "local"
