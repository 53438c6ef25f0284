"""Real virtual environments for the install and interpreter tests: ``python -m venv
--system-site-packages`` (torch and the dependencies come from this interpreter's site), into
which a test installs what it needs with pip."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_TOP = {"tests", "multirun", "outputs", "docs"}


def copy_checkout(dest: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked and not ignored), tests left out."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = REPO / rel
        if rel.split("/", 1)[0] in SKIP_TOP or not (src.is_file() or src.is_symlink()):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # as git checks it out (sweepbench/conf -> ../conf)
            (dest / rel).symlink_to(src.readlink())
        else:
            shutil.copy2(src, dest / rel)
    return dest


def make_venv(path: Path) -> Path:
    """A venv over this interpreter's site-packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip install {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
