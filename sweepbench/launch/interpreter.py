"""Is ``launch.python`` an interpreter the job's ranks can run in? Asked once per interpreter,
before any rank starts: it must be an executable Python that imports this version of sweepbench
and finds torch (the rank's entry is ``python -m sweepbench.launch.rank``). Each refusal is one
line naming the interpreter and what it lacks."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess

import sweepbench

PROBE_TIMEOUT_S = 30
# run by the interpreter under test: what a rank of it would import, without paying for torch
_PROBE = """\
import importlib.util, json, sys
out = {"python": sys.version.split()[0]}
try:
    import sweepbench
    out["sweepbench"] = getattr(sweepbench, "__version__", "?")
except Exception as err:
    out["sweepbench_error"] = f"{type(err).__name__}: {err}"
out["torch"] = importlib.util.find_spec("torch") is not None
print("SWEEPBENCH-PROBE " + json.dumps(out))
"""


@functools.lru_cache(maxsize=None)
def interpreter_problem(python: str) -> str:
    """Why ranks cannot start with ``python`` ("" when they can)."""
    where = f"launch.python={python}"
    if os.sep not in python:  # a bare name is looked up on PATH, as the ranks' start does
        python = shutil.which(python) or python
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return f"{where} is not an executable file; give a Python interpreter (e.g. /path/to/venv/bin/python)"
    try:  # in a session of its own, killed whole: nothing the probe started outlives it
        child = subprocess.Popen(
            [python, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as err:
        return f"{where} cannot be run ({err.strerror or err}); give a Python interpreter"
    try:
        stdout, stderr = child.communicate(_PROBE, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{where} did not answer within {PROBE_TIMEOUT_S} s when asked to import sweepbench"
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.communicate()
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    found = [line for line in proc.stdout.splitlines() if line.startswith("SWEEPBENCH-PROBE ")]
    if proc.returncode != 0 or not found:
        said = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])[:160]
        return (
            f"{where} is not a Python interpreter that runs (exit code {proc.returncode}"
            f"{': ' + said if said else ''}); give one, e.g. /path/to/venv/bin/python"
        )
    probe = json.loads(found[-1].split(" ", 1)[1])
    if "sweepbench_error" in probe:
        return (
            f"{where} (Python {probe['python']}) cannot import sweepbench ({probe['sweepbench_error']}); "
            f"install it there: {python} -m pip install <this checkout>"
        )
    if probe["sweepbench"] != sweepbench.__version__:
        return (
            f"{where} has sweepbench {probe['sweepbench']}, not this driver's {sweepbench.__version__}; "
            f"install the same version there"
        )
    if not probe["torch"]:
        return f"{where} (Python {probe['python']}) lacks torch; install it there"
    return ""


def check_interpreter(python: str) -> None:
    """ValueError (one line) unless ranks can start with ``python`` ("" is the driver's own)."""
    if python:
        problem = interpreter_problem(python)
        if problem:
            raise ValueError(problem)
