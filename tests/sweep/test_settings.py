"""Settings that cannot work are refused before any rank starts: one line naming the value and
what would be valid, exit 2, no sweep directory left. Rounds beyond their bound; a ``launch.python``
that is not an interpreter the ranks can run in (checked up front, once per interpreter); a swept
setting of how jobs run (``launch.*``, ``sweep.*``), which would otherwise collapse into one job;
kept ranks with another interpreter."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sweepbench

from tests.conftest import TINY, run_sweepbench

REPO = Path(__file__).resolve().parents[2]


def _refused(tmp_path: Path, args: list[str]) -> str:
    cwd, sweep_dir = tmp_path / "cwd", tmp_path / "sweep"
    run = run_sweepbench([*TINY, "parallelism=tp1", *args], sweep_dir=sweep_dir, cwd=cwd)
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: "), run.stderr
    assert not sweep_dir.exists() and list(cwd.iterdir()) == [], run.describe()
    assert "Traceback" not in run.stdout + run.stderr and "Launching" not in run.stdout
    return lines[0]


@pytest.mark.parametrize("repeats", ["1001", "1000000000", "100000000000000000000"])
def test_rounds_beyond_the_bound_are_refused(tmp_path: Path, repeats: str) -> None:
    line = _refused(tmp_path, [f"sweep.repeats={repeats}"])
    assert f"sweep.repeats={repeats} is more than 1000 rounds" in line and "use 1..1000" in line


@pytest.mark.parametrize("timeout", ["604801", "1e15"])
def test_a_job_timeout_beyond_a_week_is_refused(tmp_path: Path, timeout: str) -> None:
    """Process groups take the timeout in milliseconds as a C int: 1e15 s failed every job with an
    OverflowError in its ranks."""
    line = _refused(tmp_path, [f"launch.timeout_s={timeout}"])
    assert f"launch.timeout_s={float(timeout):g} is more than 604800 s (a week)" in line, line


@pytest.mark.parametrize("swept, values", [
    ("launch.keep_ranks=true,false", "launch.keep_ranks is swept (true, false)"),
    ("launch.preload=true,false", "launch.preload is swept (true, false)"),
    ("sweep.repeats=1,3", "sweep.repeats is swept (1, 3)"),
    ("launch.timeout_s=60,120", "launch.timeout_s is swept (60.0, 120.0)"),
    ("wandb.mode=offline,disabled", "wandb.mode is swept (\"offline\", \"disabled\")"),
])
def test_a_swept_setting_of_how_jobs_run_is_refused_not_collapsed(tmp_path: Path, swept: str, values: str) -> None:
    line = _refused(tmp_path, [swept])
    assert values in line and "the jobs would be one" in line and "run one sweep per value" in line, line


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(stat.S_IRWXU)
    return path


@pytest.fixture(scope="module")
def interpreters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Interpreters ranks cannot run in: a venv without sweepbench; one whose sweepbench is another
    version; one with this sweepbench but no torch; a shell script; a file that is not executable."""
    root = tmp_path_factory.mktemp("pythons")
    out = {}
    for name, site in (("bare", False), ("older", True), ("notorch", False)):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if site else []),
                        str(root / name)], check=True, timeout=120)
        out[name] = root / name / "bin" / "python"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    older = root / "older" / "lib" / f"python{ver}" / "site-packages" / "sweepbench"
    older.mkdir(parents=True)
    (older / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (root / "notorch" / "lib" / f"python{ver}" / "site-packages" / "checkout.pth").write_text(f"{REPO}\n")
    out["script"] = _executable(root / "script.sh", "#!/bin/sh\necho 'this is no python'\n")
    out["text"] = root / "notes.txt"
    out["text"].write_text("print('hi')\n")
    return out


@pytest.mark.parametrize("which, says", [
    ("bare", "cannot import sweepbench (ModuleNotFoundError: No module named 'sweepbench'); install it there"),
    ("older", f"has sweepbench 0.0.1, not this driver's {sweepbench.__version__}; install the same version there"),
    ("notorch", "lacks torch; install it there"),
    ("script", "is not a Python interpreter that runs (exit code 0: this is no python)"),
    ("text", "is not an executable file"),
    ("missing", "is not an executable file"),
])
def test_an_interpreter_the_ranks_cannot_run_in_is_refused_up_front(
        tmp_path: Path, interpreters: dict[str, Path], which: str, says: str) -> None:
    python = interpreters.get(which, tmp_path / "no" / "python")
    line = _refused(tmp_path, [f"launch.python={python}"])
    assert f"launch.python={python}" in line and says in line, line


def test_kept_ranks_with_another_interpreter_are_refused(tmp_path: Path, interpreters: dict[str, Path]) -> None:
    line = _refused(tmp_path, ["launch.keep_ranks=true", f"launch.python={interpreters['older']}"])
    assert f"launch.keep_ranks=true with launch.python={interpreters['older']}" in line
    assert "only ranks forked from the driver's own interpreter" in line, line


def test_an_interpreter_named_bare_is_looked_up_on_path(tmp_path: Path, interpreters: dict[str, Path]) -> None:
    """``launch.python=NAME`` runs NAME from PATH, as the ranks' start does: found there and able,
    it is planned; a bare name that names no able interpreter is refused like a path."""
    from tests.conftest import base_env

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ourpython").symlink_to(sys.executable)
    _executable(bin_dir / "barepython", f'#!/bin/sh\nexec {interpreters["bare"]} "$@"\n')
    env = base_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run = run_sweepbench([*TINY, "parallelism=tp1", "launch.python=ourpython", "sweep.dry_run=true"],
                         sweep_dir=tmp_path / "plan", env=env)
    assert run.rc == 0 and "-py=ourpython" in run.stdout, run.describe()
    run = run_sweepbench([*TINY, "parallelism=tp1", "launch.python=barepython"], sweep_dir=tmp_path / "sweep",
                         env=env)
    assert run.rc == 2 and "launch.python=barepython" in run.stderr and "cannot import sweepbench" in run.stderr, \
        run.describe()
    assert not (tmp_path / "sweep").exists()



def test_an_interpreter_that_hangs_is_refused_and_leaves_no_process(tmp_path: Path, monkeypatch) -> None:
    """The probe waits PROBE_TIMEOUT_S (here 2 s), then kills the interpreter's whole session: a
    child it started is gone too (checked by pid)."""
    from sweepbench.launch import interpreter

    pids = tmp_path / "pids"
    hangs = _executable(tmp_path / "hangs", f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\nwait\n")
    monkeypatch.setattr(interpreter, "PROBE_TIMEOUT_S", 2)
    assert interpreter.interpreter_problem.__wrapped__(str(hangs)) == (
        f"launch.python={hangs} did not answer within 2 s when asked to import sweepbench")
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or " Z " in Path(f"/proc/{child}/stat").read_text(), child
