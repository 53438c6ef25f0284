"""The driver's path stays light: a typo, --help and a dry run never import torch (only a
running job does), so they answer in about a second rather than several."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import base_env

CASES = {
    "dry-run": ["-m", "benchmark=collective,refit,reshard", "sweep.dry_run=true"],
    "typo": ["parallelsm=tp2"],
    "help": ["--help"],
}
HEAVY = ("torch", "matplotlib", "wandb", "pandas")


@pytest.mark.parametrize("case", sorted(CASES))
def test_driver_path_does_not_import_torch(tmp_path: Path, case: str) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sweepbench", *CASES[case],
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"] if case != "help" else
                          [sys.executable, "-X", "importtime", "-m", "sweepbench", "--help"],
                          cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == (2 if case == "typo" else 0), proc.stderr[-3000:]
    imported = {m.group(1) for m in re.finditer(r"^import time:.*\|\s+(\S+)$", proc.stderr, re.M)}
    assert imported, "no -X importtime output"
    assert "sweepbench.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in HEAVY}, sorted(m for m in imported if m.split(".")[0] in HEAVY)
    if case == "typo":
        errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
        assert errors == ["sweepbench: error: unknown key parallelsm: did you mean parallelism?"], errors
