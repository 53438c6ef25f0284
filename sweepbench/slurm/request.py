"""What one job asks SLURM for, computed from its own config (jobs of one sweep differ).

One SLURM task per rank, one GPU per rank:

* GPUs per node: ``launch.gpus_per_node``, else the launcher preset's ``gpus_per_node`` (your
  cluster's), else 0 (a CPU job, no GPU requested);
* ranks (= tasks) per node: ``launch.ranks_per_node``, else min(world size, GPUs per node) on
  GPUs, else the whole world on one node;
* nodes = world size / ranks per node; GPUs requested per node = ranks per node;
* time limit: the preset's ``timeout_min``, else ``launch.timeout_s`` rounded up to minutes plus
  the preset's ``startup_min``;
* interpreter: ``launch.python`` (a venv's ``bin/python``, on a filesystem the nodes share),
  else the driver's: srun starts each task with it, so the ranks run in that environment.

E.g. tp4pp2 (world 8) with 4 GPUs per node: 2 nodes x 4 tasks, 4 GPUs per node."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig

# Launcher fields sweepbench computes per job; a preset must leave them unset.
COMPUTED_FIELDS = ("nodes", "tasks_per_node")
# Launcher fields that are sweepbench's own, not submitit parameters.
OWN_FIELDS = frozenset(
    {
        "startup_min",
        "poll_s",
        "requeue",
        "srun_args",
        "submitit_folder",
        "max_num_timeout",
        "gpus_per_node",
        "timeout_min",
        *COMPUTED_FIELDS,
    }
)
# SLURM may send the time-limit warning (--signal) up to ~30 s early; the tasks need a few seconds
# to start and install submitit's handler, so the warning never asks for more than limit - 45 s.
SIGNAL_SLACK_S = 45
# hydra-submitit-launcher's shared fields (BaseQueueConf): passed to submitit unprefixed.
SHARED_FIELDS = frozenset(
    {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name", "stderr_to_stdout"}
)


@dataclass(frozen=True)
class SlurmRequest:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: no GPU requested
    timeout_min: int
    python: str = ""  # the tasks' interpreter; "": the driver's

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def describe(self) -> str:
        gpus = f"{self.gpus_per_node} GPUs/node" if self.gpus_per_node else "no GPU"
        python = f", python {self.python}" if self.python else ""
        return (
            f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.tasks_per_node} tasks, {gpus}, "
            f"{self.timeout_min} min{python}"
        )


def job_request(cfg: DictConfig, world_size: int, params: Mapping[str, Any]) -> SlurmRequest:
    """The request of the job ``cfg`` (world size ``world_size``) under the launcher ``params``.

    Raises ValueError, naming the setting, for a layout that cannot be placed."""
    for key in COMPUTED_FIELDS:
        if params.get(key) is not None:
            raise ValueError(
                f"hydra.launcher.{key}={params[key]} is computed per job from its world size; "
                f"remove it (set launch.ranks_per_node or launch.gpus_per_node instead)"
            )
    gpus = int(cfg.launch.gpus_per_node or params.get("gpus_per_node") or 0)
    if gpus < 0 or cfg.launch.ranks_per_node < 0:
        raise ValueError("launch.gpus_per_node and launch.ranks_per_node must be >= 0")
    per_node = int(cfg.launch.ranks_per_node or (min(world_size, gpus) if gpus else world_size))
    if world_size % per_node:
        raise ValueError(
            f"{per_node} ranks per node (launch.ranks_per_node, or GPUs per node) does not "
            f"divide world_size={world_size}"
        )
    if gpus and per_node > gpus:
        raise ValueError(
            f"launch.ranks_per_node={per_node} needs {per_node} GPUs per node, but nodes have "
            f"{gpus} (launch.gpus_per_node): one GPU per rank"
        )
    timeout = params.get("timeout_min") or math.ceil(cfg.launch.timeout_s / 60) + int(params.get("startup_min") or 0)
    python = str(cfg.launch.python or "")
    if python and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ValueError(
            f"launch.python={python} is not an executable file; give a Python interpreter "
            f"(e.g. /path/to/venv/bin/python) on a filesystem the nodes share"
        )
    return SlurmRequest(
        nodes=world_size // per_node,
        tasks_per_node=per_node,
        gpus_per_node=per_node if gpus else 0,
        timeout_min=int(timeout),
        python=python,
    )


def executor_init(cluster: str, params: Mapping[str, Any], request: SlurmRequest) -> dict[str, Any]:
    """submitit.AutoExecutor's constructor arguments (the interpreter is the executor's, not a
    job parameter: jobs of different interpreters go in different executors)."""
    init: dict[str, Any] = {
        "folder": params["submitit_folder"],
        "cluster": cluster,
        f"{cluster}_max_num_timeout": int(params.get("max_num_timeout") or 0),
    }
    if request.python:
        init[f"{cluster}_python"] = shlex.quote(request.python)  # submitit puts it in a shell line as is
    return init


def executor_parameters(cluster: str, params: Mapping[str, Any], request: SlurmRequest) -> dict[str, Any]:
    """submitit.AutoExecutor.update_parameters arguments: the preset's parameters plus the request."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in OWN_FIELDS or value is None:
            continue
        out[key if key in SHARED_FIELDS else f"{cluster}_{key}"] = value
    out.update(nodes=request.nodes, tasks_per_node=request.tasks_per_node, timeout_min=request.timeout_min)
    if request.gpus_per_node:
        out["gpus_per_node"] = request.gpus_per_node
    if params.get("signal_delay_s") is not None:  # the time-limit warning must not come before the job starts
        latest = max(request.timeout_min * 60 - SIGNAL_SLACK_S, 1)
        out[f"{cluster}_signal_delay_s"] = min(int(params["signal_delay_s"]), latest)
    if cluster == "slurm":
        out["slurm_srun_args"] = list(params.get("srun_args") or [])
        if params.get("requeue"):
            out["slurm_additional_parameters"] = {"requeue": True, **dict(params.get("additional_parameters") or {})}
    return out
