"""env.json: the software and hardware a job ran on, with secrets redacted.

On a local job rank 0 captures it (so it names the interpreter and the package versions the
ranks actually ran with, ``launch.python`` included); the driver captures it only for a job that
never reported. ``redact_config`` applies the same rules to the config copied into metrics.json."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# Environment variables worth keeping next to a result (prefixes), and what marks a secret.
RELEVANT_PREFIXES = (
    "NCCL_",
    "CUDA_",
    "TORCH_",
    "NVSHMEM_",
    "SLURM_",
    "SUBMITIT_",
    "WANDB_",
    "OMP_",
    "MASTER_",
    "GLOO_",
    "PYTORCH_",
    "HYDRA_",
)
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# a config key is a secret when one of its words is one of these (``api_key``, ``hf_token``), so
# that ``num_tokens`` or ``num_kv_heads`` stay readable; and only string values are redacted
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"})
REDACTED = "<redacted>"
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s]+)@")
WHEEL_COMMIT = "unknown (wheel install)"


def is_secret_name(name: str) -> bool:
    """An environment variable's name that marks its value secret."""
    return any(m in name.upper() for m in SECRET_MARKERS)


def is_secret_key(key: str) -> bool:
    """A config key that marks its value secret."""
    return any(word in SECRET_WORDS for word in re.split(r"[^a-z0-9]+", key.lower()))


def redact_value(value: str) -> str:
    """A URL's ``user:password@`` becomes ``<redacted>@``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", value)


def _redact(name: str, value: str) -> str:
    return REDACTED if is_secret_name(name) else redact_value(value)


def redact_config(node: Any, *, key: str = "") -> Any:
    """A config (plain containers) with secret-looking keys' values and URL credentials redacted."""
    if isinstance(node, dict):
        return {k: redact_config(v, key=str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_config(v, key=key) for v in node]
    if isinstance(node, str) and node and is_secret_key(key):
        return REDACTED
    return redact_value(node) if isinstance(node, str) else node


def relevant_environment() -> dict[str, str]:
    return {k: _redact(k, v) for k, v in sorted(os.environ.items()) if k.startswith(RELEVANT_PREFIXES)}


def _package_root() -> Path:
    import sweepbench

    return Path(sweepbench.__file__).resolve().parent


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the checkout sweepbench runs from; a wheel install has none to ask."""
    checkout = _package_root().parent
    if not (checkout / ".git").exists():
        return {"commit": WHEEL_COMMIT, "dirty": None}
    commit = _git(checkout, "rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git(checkout, "status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty}


def sweepbench_info() -> dict[str, Any]:
    import sweepbench

    return {"version": getattr(sweepbench, "__version__", "unknown"), "location": str(_package_root())}


def dependency_versions() -> dict[str, str | None]:
    """The installed version of each distribution sweepbench depends on, as this interpreter sees them."""
    try:
        requires = importlib.metadata.requires("sweepbench") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    names = {re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r}
    versions: dict[str, str | None] = {}
    for name in sorted(n for n in names if n):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpu_info() -> dict[str, Any]:
    """GPU names, count and driver through NVML, so the recording process creates no CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
            return {
                "count": count,
                "names": [str(n) for n in names],
                "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML (a CPU machine): fall back to what torch sees
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return {"count": count, "names": [torch.cuda.get_device_name(i) for i in range(count)], "driver": None}


def slurm_ids() -> dict[str, str | None]:
    keys = {
        "job_id": "SLURM_JOB_ID",
        "array_job_id": "SLURM_ARRAY_JOB_ID",
        "array_task_id": "SLURM_ARRAY_TASK_ID",
        "restart_count": "SLURM_RESTART_COUNT",
        "nodelist": "SLURM_JOB_NODELIST",
    }
    return {k: os.environ.get(v) for k, v in keys.items()}


def capture_env() -> dict[str, Any]:
    import torch

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        # as torch reports it (cuDNN 9: major * 10000 + minor * 100 + patch); None without cuDNN
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "sweepbench": sweepbench_info(),
        "packages": dependency_versions(),
        "gpus": gpu_info(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "git": git_state(),
        "slurm": slurm_ids(),
        "environment": relevant_environment(),
    }
