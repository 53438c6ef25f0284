"""Every command in README.md and docs/ that starts with ``python -m sweepbench`` or ``sweepbench``
runs: a sweep as a dry run (every job composed, validated and tagged; nothing started), ``report``
and ``compare`` for real on the session's main sweep. The docs cannot rot silently."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweepbench.config.validate import visible_gpus
from tests.conftest import SweepRun, base_env, run_sweepbench

ROOT_DIR = Path(__file__).resolve().parents[2]
DOCS = [ROOT_DIR / "README.md", *sorted(p for p in (ROOT_DIR / "docs").rglob("*.md")
                                      if not p.relative_to(ROOT_DIR / "docs").parts[0] in ("results", "_incoming"))]
STARTS = ("python -m sweepbench", "sweepbench ")
# the one refusal a GPU command gets on a CPU machine, after every other check passed
GPU_REFUSAL = re.compile(r"^sweepbench: error: .*(runs on cuda only|needs a GPU|GPUs, but 0 are visible|fails on a CPU"
                         r"|runs on GPUs, not backend=)", re.M)
NCCL_TESTS_BUILD = "/path/to/nccl-tests/build"  # the docs' placeholder for a user's nccl-tests build


def code_commands(text: str) -> list[str]:
    """Commands in code blocks (indented four spaces, or fenced), continuation lines joined."""
    out, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            continue
        line = (pending + " " + line.strip()) if pending else line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        if line.startswith(STARTS) or line == "python -m sweepbench":
            out.append(line)
    return out


COMMANDS = [(path.relative_to(ROOT_DIR).as_posix(), cmd)
            for path in DOCS for cmd in code_commands(path.read_text())]


def args_of(cmd: str, *, user_conf: Path, sweeps: list[Path], nccl_tests: Path | None = None) -> list[str]:
    """The command's arguments after ``sweepbench``, with the docs' placeholders made real: a user's
    config directory, an nccl-tests build, the sweeps a report reads, optional ``[...]`` parts left out."""
    cmd = re.sub(r"\s\[--[^]]*\]", "", cmd)  # optional arguments as usage text shows them
    if nccl_tests is not None:
        cmd = cmd.replace(NCCL_TESTS_BUILD, str(nccl_tests))
    cmd = cmd.replace("file://$HOME/my_conf", f"file://{ROOT_DIR / 'docs' / 'slurm_example'}")
    cmd = cmd.replace("file:///path/to/my_conf", f"file://{user_conf}")
    words = shlex.split(cmd, comments=True)
    words = words[3:] if words[0] == "python" else words[1:]
    named: dict[str, Path] = {}
    out = []
    for word in words:
        if word.startswith("multirun/") or word == "...":  # a sweep the docs name: one of ours
            word = str(named.setdefault(word, sweeps[len(named) % len(sweeps)]))
        out.append(word)
    return out


@pytest.fixture(scope="module")
def user_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's own config directory the docs show: a model and a saved grid."""
    conf = tmp_path_factory.mktemp("my_conf")
    (conf / "model").mkdir()
    shutil.copy(ROOT_DIR / "conf" / "model" / "tiny.yaml", conf / "model" / "my_model.yaml")
    (conf / "experiment").mkdir()
    (conf / "experiment" / "my_grid.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      benchmark.max_bytes: 1024,1048576\n"
        "      parallelism: tp1,tp2\n")
    return conf


@pytest.fixture(scope="module")
def docs_sweep(main_sweep: SweepRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the main sweep for the docs' report/compare commands (they write into the sweep
    they read; the other tests read the main sweep's directory as the sweep left it)."""
    copy = tmp_path_factory.mktemp("docs_sweep") / "sweep"
    shutil.copytree(main_sweep.sweep_dir, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def nccl_tests_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the docs point at an nccl-tests build: a directory holding its binaries' names as
    executables (a dry run checks they are there; nothing runs them)."""
    from sweepbench.collective.nccl_tests import BINARIES

    build = tmp_path_factory.mktemp("nccl_tests_build")
    for name in BINARIES.values():
        (build / name).write_text("#!/bin/sh\nexit 1\n")
        (build / name).chmod(0o755)
    return build


def test_the_docs_hold_commands() -> None:
    pages = {page for page, _ in COMMANDS}
    assert "README.md" in pages and len(pages) >= 8, pages
    assert code_commands("    python -m sweepbench -m a=1 \\\n        b=2   # note\n    sweepbench/x/  no\n") == \
        ["python -m sweepbench -m a=1 b=2   # note"]


@pytest.mark.parametrize(("page", "cmd"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_docs_command_runs(page: str, cmd: str, docs_sweep: Path, user_conf: Path, nccl_tests_build: Path,
                           tmp_path: Path) -> None:
    args = args_of(cmd, user_conf=user_conf, sweeps=[docs_sweep], nccl_tests=nccl_tests_build)
    if args and args[0] in ("report", "compare", "store"):
        env = base_env(SWEEPBENCH_STORE_DIR=str(tmp_path / "store")) if args[0] == "store" else base_env()
        proc = subprocess.run([sys.executable, "-m", "sweepbench", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert "Traceback" not in proc.stderr, f"{page}: {cmd}\n{proc.stderr[-3000:]}"
        # a sweep against itself is never slower (exit 1) and every job has its twin (3); with
        # --fail-on-regression its cases may all be too noisy to call unchanged (4, said in one line)
        undecided = proc.returncode == 4 and "--fail-on-regression" in args and "error: undecided:" in proc.stderr
        assert proc.returncode == 0 or undecided, f"{page}: {cmd} -> exit {proc.returncode}\n{proc.stderr[-3000:]}"
        return
    multirun = "-m" in args
    args = [a for a in args if a != "-m" and not a.startswith("hydra.sweep.dir=")]
    # a GPU-sized command on this CPU machine: the memory check is its hardware's business
    run = run_sweepbench([*args, "sweep.dry_run=true", "launch.skip_memory_check=true"],
                         sweep_dir=tmp_path / "sweep", multirun=multirun)
    if run.rc == 2 and visible_gpus() == 0 and GPU_REFUSAL.search(run.stderr):
        return  # every other check passed: what is left is the GPU the command is written for
    assert run.rc == 0, f"{page}: {cmd} -> exit {run.rc}\n{run.stderr[-3000:]}"
    assert re.search(r"^dry run: .* \d+ jobs, one per line:$", run.stdout, re.M), run.stdout[-2000:]  # planned, not run
    assert not run.sweep_dir.exists()
