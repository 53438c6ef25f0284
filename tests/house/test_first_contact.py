"""What a new user meets first: ``--help`` (sweepbench's own page, from ``python -m sweepbench`` and
the console script), internal schemas neither listed nor accepted, ``report --wandb`` without a
login, and docs whose links, launcher names and fault switches are the ones that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweepbench.launch.faults import FAULTS

from ..conftest import TINY, base_env, run_sweepbench

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                    if p.relative_to(ROOT / "docs").parts[0] not in ("results", "_incoming"))]
LAUNCHERS = {p.stem for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")} | \
    {p.stem for p in (ROOT / "docs" / "slurm_example" / "hydra" / "launcher").glob("*.yaml")}


@pytest.mark.parametrize("argv", [[sys.executable, "-m", "sweepbench", "--help"], ["sweepbench", "--help"],
                                  ["sweepbench", "-h"]], ids=["python -m", "console script", "-h"])
def test_help_is_sweepbenchs_own_page(argv: list[str], tmp_path: Path) -> None:
    if argv[0] == "sweepbench":
        argv = [shutil.which("sweepbench") or "sweepbench", *argv[1:]]
    proc = subprocess.run(argv, cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    page = proc.stdout
    assert page.startswith("sweepbench: ")
    for part in ("benchmarks (benchmark=NAME):", "-m parallelism=tp2,tp4", "sweep.dry_run=true", "sweepbench report",
                 "sweepbench compare", "docs: README.md", "hydra/launcher=slurm"):
        assert part in page, part
    for name in ("refit", "reshard", "collective", "attention", "train"):
        assert re.search(rf"^  {name} +\S", page, re.M), name  # each benchmark with what it measures
    assert "base_" not in page and "powered by Hydra" not in page


@pytest.mark.parametrize("arg", ["benchmark=base_refit", "model=tiny,base_model", "parallelism=base_parallelism"])
def test_internal_schemas_are_not_accepted(arg: str, tmp_path: Path) -> None:
    run = run_sweepbench([arg, "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    (line,) = run.stderr.strip().splitlines()
    group = arg.split("=")[0]
    assert re.match(rf"^sweepbench: error: {group}=base_\w+ is an internal schema, not a {group}; choose one of ", line)
    assert "base_" not in line.split("choose one of ")[1]
    assert not run.sweep_dir.exists()


def test_report_wandb_without_a_login_is_one_line(tmp_path: Path) -> None:
    sweep = run_sweepbench([*TINY, "parallelism=tp1"], sweep_dir=tmp_path / "sweep")
    assert sweep.rc == 0, sweep.describe()
    home = tmp_path / "home"  # no ~/.netrc, no wandb settings: never logged in
    home.mkdir()
    env = base_env(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config" / "wandb"))
    env.pop("WANDB_MODE")
    proc = subprocess.run([sys.executable, "-m", "sweepbench", "report", str(sweep.sweep_dir), "--wandb"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "sweepbench: publishing a workspace needs a wandb login (`wandb login`); nothing was published"]
    assert (sweep.sweep_dir / "report.html").is_file()


@pytest.mark.parametrize("page", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_docs_links_and_launchers_exist(page: Path) -> None:
    text = page.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
    for name in re.findall(r"hydra/launcher=([\w-]+)", text):
        assert name in LAUNCHERS, f"{page.relative_to(ROOT)} names hydra/launcher={name}; presets: {sorted(LAUNCHERS)}"


def test_running_md_lists_every_fault() -> None:
    text = (ROOT / "docs" / "running.md").read_text()
    for kind in FAULTS:
        assert re.search(rf"fault\.kind=[\w|\\]*\b{kind}\b", text), kind
    assert "fault.factor" in text
