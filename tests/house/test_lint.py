"""The package passes ruff's check (pyproject's [tool.ruff]: pyflakes and syntax errors): an undefined
name, an unused import or variable, or a dictionary key written twice fails here, not at run time.
And it is laid out as ``ruff format`` lays it out, so a change shows what it changes, not a re-wrap.
And mypy (pyproject's [tool.mypy]) finds no type error in it: an attribute of an Optional used
unchecked, a call with the wrong argument type, a stale ``# type: ignore``."""

import subprocess
import sys
from pathlib import Path

from ..conftest import mypy_result

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_is_clean_over_the_package() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "sweepbench", "hydra_plugins"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_check_catches_an_undefined_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_name\n")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "F821" in proc.stdout, proc.stdout + proc.stderr


def test_the_package_is_formatted() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "sweepbench", "hydra_plugins"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\n(run: ruff format sweepbench hydra_plugins)"


def test_ruff_format_check_catches_a_file_laid_out_by_hand(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("x = {  'a':1 }\n")
    proc = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--config", str(ROOT / "pyproject.toml"),
                           str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "would be reformatted" in proc.stdout, proc.stdout + proc.stderr


def test_mypy_is_clean_over_the_package() -> None:
    # one run over sweepbench and hydra_plugins, as pyproject's [tool.mypy] names them (about a minute
    # cold), started with the session (tests/conftest.py)
    rc, output = mypy_result(timeout=290)
    assert rc == 0, output + "\n(run: python -m mypy)"
