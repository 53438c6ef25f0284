"""env.json: the software and hardware a job ran on, with secret-looking variables redacted."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

# Environment variables worth keeping next to a result (prefixes), and what marks a secret.
RELEVANT_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "SLURM_", "SUBMITIT_", "WANDB_", "OMP_",
                     "MASTER_", "GLOO_", "PYTORCH_", "HYDRA_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def _redact(name: str, value: str) -> str:
    return REDACTED if any(m in name.upper() for m in SECRET_MARKERS) else value


def relevant_environment() -> dict[str, str]:
    return {k: _redact(k, v) for k, v in sorted(os.environ.items()) if k.startswith(RELEVANT_PREFIXES)}


def _git(*args: str) -> str | None:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    commit = _git("rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty}


def gpu_info() -> dict[str, Any]:
    """GPU names, count and driver through NVML, so the recording process creates no CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
            return {"count": count, "names": [str(n) for n in names],
                    "driver": str(pynvml.nvmlSystemGetDriverVersion())}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML (a CPU machine): fall back to what torch sees
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return {"count": count, "names": [torch.cuda.get_device_name(i) for i in range(count)], "driver": None}


def slurm_ids() -> dict[str, str | None]:
    keys = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID",
            "array_task_id": "SLURM_ARRAY_TASK_ID", "restart_count": "SLURM_RESTART_COUNT",
            "nodelist": "SLURM_JOB_NODELIST"}
    return {k: os.environ.get(v) for k, v in keys.items()}


def capture_env() -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpus": gpu_info(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "git": git_state(),
        "slurm": slurm_ids(),
        "environment": relevant_environment(),
    }
