"""README's first command from a clone: ``pip install . && python -m sweepbench``, a NON-editable
install, run in the checkout's root (where ``./sweepbench`` shadows the installed package; its
``conf`` is the link to the checkout's ``conf/``) and from anywhere else (the wheel's ``sweepbench.conf``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ..conftest import TINY, base_env
from .venvs import copy_checkout, make_venv, pip_install


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("install")
    clone = copy_checkout(root / "clone")
    python = make_venv(root / "venv")
    pip_install(python, "--no-deps", str(clone))  # dependencies (torch...) come from the system site
    return {"root": root, "clone": clone, "python": python}


def _run(installed: dict[str, Path], cwd: Path, sweep_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["python"]), "-m", "sweepbench", *TINY, "parallelism=tp1",
                           f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, env=base_env(),
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("where", ["checkout_root", "elsewhere"])
def test_first_command_runs(installed: dict[str, Path], where: str) -> None:
    cwd = installed["clone"] if where == "checkout_root" else installed["root"] / "elsewhere"
    cwd.mkdir(exist_ok=True)
    sweep_dir = installed["root"] / f"sweep_{where}"
    proc = _run(installed, cwd, sweep_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p for p in sweep_dir.iterdir() if p.is_dir()]
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["verified"] is True
    # which sweepbench ran: the clone's source in its root, the installed wheel elsewhere
    probe = subprocess.run([str(installed["python"]), "-c", "import sweepbench; print(sweepbench.__file__)"],
                           cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    if where == "checkout_root":
        assert Path(probe).is_relative_to(installed["clone"])
    else:
        assert "site-packages" in probe and Path(probe).is_relative_to(installed["root"] / "venv")
        env = json.loads((job / "env.json").read_text())
        assert env["sweepbench"]["version"]
        assert env["git"]["commit"] == "unknown (wheel install)"  # no checkout to ask, and it says so


def test_wheel_holds_every_package(installed: dict[str, Path]) -> None:
    """Every package folder of the source (a new engine included) is in the installed wheel."""
    site = next((installed["root"] / "venv" / "lib").glob("python*/site-packages"))
    for init in installed["clone"].glob("**/__init__.py"):
        folder = init.parent.relative_to(installed["clone"])
        if folder.parts[0] in ("sweepbench", "hydra_plugins"):
            assert (site / folder / "__init__.py").is_file(), f"{folder} is missing from the wheel"
    assert (site / "sweepbench" / "conf" / "config.yaml").is_file()
    assert (site / "sweepbench" / "py.typed").is_file()
