"""The types every layer shares. This module imports nothing of sweepbench, so any folder may
import it: a rank's context, a failed verification, and the outcome of a job's launch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

if TYPE_CHECKING:  # torch is imported only where a job runs (ranks), never on the driver's path
    import torch


class NotOnThisMachine(ValueError):
    """A job that is valid in itself but cannot run where its device type resolved on this machine
    (``backend=auto``: e.g. a CUDA-only impl planned from a login node without GPUs). A dry run lists
    the job with this as its fit note; a real run refuses with it."""


class VerificationError(AssertionError):
    """A benchmark's output differs from its reference: the job fails, its times are not reported."""


@dataclass
class RankContext:
    """Where a rank stands: its place in the default process group and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: "torch.device"
    backend: str  # the backend actually used (never "auto")
    cfg: DictConfig  # the whole resolved job config
    job_dir: Path | None = None  # the job's directory (for files a benchmark writes: traces, event files)


@dataclass
class JobOutcome:
    status: str  # ok | failed | timeout | interrupted
    error: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
