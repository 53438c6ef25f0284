"""Shared fixtures of the CPU suite: real sweeps (subprocesses, gloo ranks, real files) and the
Hydra compose API. Sweeps are few and small; many tests assert on each (session/module scope)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pandas as pd
import pytest
from omegaconf import DictConfig

# The collective benchmark, named explicitly (it is not necessarily the default one), at small
# sizes everywhere: the machine has 2 cores.
COLLECTIVE = "benchmark=collective"
SMALL = [COLLECTIVE, "benchmark.max_bytes=4096", "benchmark.iters=3", "benchmark.warmup=1"]
# Smaller still, for jobs that are about failure handling rather than numbers.
TINY = [COLLECTIVE, "benchmark.ops=[all_reduce]", "benchmark.min_bytes=1024", "benchmark.max_bytes=1024",
        "benchmark.iters=2", "benchmark.warmup=1"]

# The main sweep: 2-rank jobs and one 4-rank job (so busbw factors differ from 1), with secrets
# in the environment that must never be written down.
MAIN_GRID = ["parallelism=tp2,dp2,tp4", *SMALL]
SECRETS = {"WANDB_API_KEY": "sekrit123", "NCCL_FAKE_TOKEN": "sekrit456", "MY_PASSWORD": "sekrit789",
           "TORCH_SECRET_THING": "sekrit000"}
VISIBLE = {"TORCH_SWEEPBENCH_MARKER": "visible111"}  # relevant and not secret: kept verbatim

SWEEP_TIMEOUT_S = 240
# rich draws as on a terminal (tables, not the plain lines of a pipe), without colours or a live line
TERMINAL = {"TTY_COMPATIBLE": "1", "NO_COLOR": "1", "TERM": "dumb"}


REPO = Path(__file__).resolve().parents[1]  # the checkout the tests run from

# the store of baselines the test session's sweeps share (not the user's ~/.cache), removed at the end
TEST_STORE = Path(os.environ.get("TMPDIR", "/tmp")) / f"sweepbench-test-store-{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def _test_store() -> Iterator[None]:
    yield
    import shutil

    shutil.rmtree(TEST_STORE, ignore_errors=True)


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a sweep: this one, made hermetic (offline wandb, Hydra's own errors
    left to sweepbench, no inherited secrets, the session's store of baselines), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WANDB_") and k != "HYDRA_FULL_ERROR"
           and not any(m in k.upper() for m in ("KEY", "TOKEN", "SECRET", "PASSWORD"))}
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1",
                "SWEEPBENCH_TEST_RUN": uuid.uuid4().hex, "SWEEPBENCH_STORE_DIR": str(TEST_STORE)})
    env.update(extra)
    return env


@dataclass
class SweepRun:
    """One ``python -m sweepbench`` invocation and what it left in its sweep dir."""

    sweep_dir: Path
    args: list[str]
    proc: subprocess.CompletedProcess
    env: dict[str, str] = field(repr=False)

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.proc.stdout

    @property
    def stderr(self) -> str:
        return self.proc.stderr

    def job_dirs(self) -> list[Path]:
        # a hidden directory is not a job's (.fastest: the sweep's wandb ranking run)
        return sorted(p for p in self.sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def metrics(self, tag: str) -> dict[str, Any]:
        return json.loads((self.sweep_dir / tag / "metrics.json").read_text())

    def env_json(self, tag: str) -> dict[str, Any]:
        return json.loads((self.sweep_dir / tag / "env.json").read_text())

    def all_metrics(self) -> dict[str, dict[str, Any]]:
        return {p.name: self.metrics(p.name) for p in self.job_dirs() if (p / "metrics.json").exists()}

    def results(self) -> pd.DataFrame:
        return pd.read_csv(self.sweep_dir / "results.csv")

    def progress(self, tag: str) -> list[str]:
        """The per-case progress lines in the job's rank-0 log, as ``i/N: label``
        (``sweepbench.measure.progress.case_done``)."""
        log = (self.sweep_dir / tag / "logs" / "rank0.log").read_text()
        return [m.group(1) + ": " + m.group(2) for m in re.finditer(r"case (\d+/\d+) done: (.*)$", log, re.M)]

    def describe(self) -> str:
        return (f"`sweepbench {' '.join(self.args)}` exited {self.rc}\n--- stdout (tail)\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}")


def run_sweepbench(args: list[str], *, sweep_dir: Path, multirun: bool = True,
                   env: dict[str, str] | None = None, cwd: Path | None = None,
                   timeout: float = SWEEP_TIMEOUT_S) -> SweepRun:
    """Run ``python -m sweepbench [-m] ARGS hydra.sweep.dir=SWEEP_DIR`` in a subprocess."""
    argv = [*(["-m"] if multirun else []), *args, f"hydra.sweep.dir={sweep_dir}"]
    env = env if env is not None else base_env()
    cwd = cwd or sweep_dir.parent
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "sweepbench", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return SweepRun(sweep_dir, argv, proc, env)


T = TypeVar("T")


def concurrently(*calls: Callable[[], T], workers: int = 0) -> list[T]:
    """Each call in a thread of its own, ``workers`` at a time (0: all at once), their results in
    order. Sweeps whose numbers no test compares run side by side: a tiny CPU sweep keeps a 2-core
    box about half busy (its processes start, import and wait on each other), so two of them
    take little longer than one."""
    with ThreadPoolExecutor(workers or len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def run_sweeps(grids: dict[str, list[str]], root: Path, *, workers: int = 0, **kwargs: Any) -> dict[str, SweepRun]:
    """``run_sweepbench(grid, sweep_dir=root / name, **kwargs)`` for each named grid, side by side
    (:func:`concurrently`, ``workers`` at a time)."""
    runs = concurrently(*(partial(run_sweepbench, grid, sweep_dir=root / name, **kwargs) for name, grid in grids.items()),
                        workers=workers)
    return dict(zip(grids, runs))


def run_interpreted(module: str) -> str:
    """``module.check()`` in a fresh interpreter with Triton's interpreter on (``TRITON_INTERPRET=1``:
    Triton kernels run on CPU tensors); its printed output, after asserting it exited 0."""
    proc = subprocess.run([sys.executable, "-c", f"from {module} import check; check()"], capture_output=True,
                          text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def wandb_inspect(run_dir: str | Path) -> dict[str, Any]:
    """Read an offline wandb run back with wandb's own reader."""
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json",
                           str(run_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"wandb leet inspect {run_dir} failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs of live processes whose environment holds NAME=VALUE (e.g. a sweep's leftover ranks)."""
    needle = f"{name}={value}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            pids.append(int(entry.name))
    return pids


# ---------------------------------------------------------------- Hydra compose API


@pytest.fixture(scope="session")
def compose() -> Iterator[Callable[..., DictConfig]]:
    """``compose(*overrides)`` -> the job config Hydra composes (the same config the CLI gets), of
    the collective benchmark unless the overrides choose one."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from sweepbench.benchmarks.registry import load_all
    from sweepbench.cli import config_source, register_sweeper
    from sweepbench.config.store import store_schemas

    register_sweeper()
    store_schemas()
    load_all()
    GlobalHydra.instance().clear()
    source = config_source()  # the CLI's: the conf/ that came with the code under test
    init = (hydra.initialize_config_module(config_module="sweepbench.conf", version_base="1.3")
            if source.startswith("pkg://") else hydra.initialize_config_dir(config_dir=source, version_base="1.3"))
    with init:
        def _compose(*overrides: str) -> DictConfig:
            chosen = any(o.startswith("benchmark=") for o in overrides)
            return hydra.compose(config_name="config", overrides=[*([] if chosen else [COLLECTIVE]), *overrides])

        yield _compose


def planned_tag(compose: Callable[..., DictConfig], *overrides: str) -> str:
    """The tag sweepbench gives the job these overrides make."""
    from sweepbench.launch.preflight import validate
    from sweepbench.sweep.tags import make_tag

    cfg = compose(*overrides)
    return make_tag(cfg, world_size=validate(cfg))


def expand_grid(args: list[str]) -> list[list[str]]:
    """A tiny grid expander for ``key=a,b`` overrides (no quoting): the jobs a sweep holds."""
    jobs: list[list[str]] = [[]]
    for arg in args:
        key, _, values = arg.partition("=")
        choices = values.split(",") if ("," in values and "[" not in values) else [values]
        jobs = [[*job, f"{key}={v}"] for job in jobs for v in choices]
    return jobs


# ---------------------------------------------------------------- the main sweep


@pytest.fixture(scope="session")
def worlds() -> Iterator[Any]:
    """The session's persistent gloo worlds by size (``tests.parallel.world.Worlds``); torch is
    imported only where a test asks for one."""
    from tests.parallel.world import Worlds

    pool = Worlds()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def main_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """``-m parallelism=tp2,dp2,tp4`` (collective, gloo, small sizes), run once per session."""
    root = tmp_path_factory.mktemp("main")
    run = run_sweepbench(MAIN_GRID, sweep_dir=root / "sweep", env=base_env(**SECRETS, **VISIBLE))
    assert run.rc == 0, run.describe()
    return run


@pytest.fixture(scope="session")
def main_tags(compose: Callable[..., DictConfig]) -> dict[str, list[str]]:
    """tag -> overrides, for each job of the main sweep, as the compose API predicts them."""
    return {planned_tag(compose, *job): job for job in expand_grid(MAIN_GRID)}


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (mount's -o size=) mounted at ``mount`` for the block (root only)."""
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_disk(filler: Path, *, chunk: int = 65536) -> None:
    """Write zeros to ``filler`` until its filesystem refuses more (ENOSPC): the disk is then full."""
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * chunk)
        except OSError:
            pass


def refusal(compose: Callable[..., DictConfig], *overrides: str) -> str:
    """The one-line ValueError that validation before any rank starts raises for ``overrides``."""
    from sweepbench.launch.preflight import validate

    with pytest.raises(ValueError) as err:
        validate(compose(*overrides))
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ---------------------------------------------------------------- mypy beside the suite
# mypy over the package takes about a minute of one core, and the suite leaves a core idle for much of
# its run (ranks start, import and wait on each other; SLURM polls). So when its test is among the
# session's, mypy starts as the tests do, at a lower priority, and the test reads what it said.
MYPY_TEST = "tests/house/test_lint.py::test_mypy_is_clean_over_the_package"
_mypy: dict[str, Any] = {}


def _start_mypy() -> None:
    import tempfile

    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "mypy"], cwd=REPO,
                            stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=lambda: os.nice(10))
    _mypy.update(proc=proc, out=out)


def mypy_result(timeout: float) -> tuple[int, str]:
    """``python -m mypy`` over the package: its exit status and output, from the run started with the
    session where there is one, else from a run now."""
    if "proc" not in _mypy:
        _start_mypy()
    proc, out = _mypy["proc"], _mypy["out"]
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.seek(0)
    return rc, out.read()


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.nodeid == MYPY_TEST for item in session.items):
        _start_mypy()


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = _mypy.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- markers
# What a test needs beyond Python: `slurm` (the SLURM daemons tests/slurm starts, as root), `browser`
# (Chromium loads a page), `root` (mounts a tmpfs for a real full disk). A user without root or apt
# runs the rest: python -m pytest -q tests -m "not slurm and not browser and not root".
BROWSER_FIXTURES = {"pages", "page"}  # tests/report fixtures that load their page in Chromium
ROOT_FIXTURES = {"small_disk", "full_disk"}  # a tmpfs


def _calls(item: pytest.Item, names: tuple[str, ...]) -> bool:
    import inspect

    fn = getattr(item, "function", None)
    try:
        source = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return False
    return any(f"{name}(" in source for name in names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "slurm" in parts:
            item.add_marker(pytest.mark.slurm)
        if ("report" in parts and BROWSER_FIXTURES & set(getattr(item, "fixturenames", ()))) \
                or _calls(item, ("visit",)):
            item.add_marker(pytest.mark.browser)
        if ROOT_FIXTURES & set(getattr(item, "fixturenames", ())) or _calls(item, ("tmpfs", "fill_disk")):
            item.add_marker(pytest.mark.root)
