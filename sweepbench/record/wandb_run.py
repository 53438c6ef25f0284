"""One wandb run per job, from the process that records the job (rank 0's host).

Runs are made to compare well with no set-up in wandb's UI: ``group`` = the sweep (unique across
machines: the sweep directory's readable tail plus a hash of its absolute path and the machine or
cluster), ``job_type`` = the benchmark, ``tags`` = the chosen config-group options
(``parallelism=tp2``), ``config`` = the flattened resolved config with secret-looking values
redacted, one history step per case, ``summary`` = the metrics, and a ``cases`` table with the
custom charts its columns allow (busbw vs message size, bandwidth per case, time vs link floor).

Offline by default. Whatever wandb does (no network, a bad key, a crash of its service), the
benchmark's local files are still written: every wandb call is guarded, and a failure only lands
in ``wandb_error``. ``NullRun`` has the same methods for ``wandb.mode=disabled`` (nanochat's
DummyWandb idea)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from omegaconf import DictConfig

log = logging.getLogger(__name__)

# wandb's limits: offline runs accept longer values and fail only at `wandb sync`
MAX_TAG, MAX_JOB_TYPE, MAX_GROUP, MAX_NAME = 64, 64, 128, 128
TAG_GROUPS = ("benchmark", "model", "parallelism", "backend", "mode")
SECRET_MARKERS = ("key", "token", "secret", "password")
REDACTED = "<redacted>"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def redact(flat: dict[str, Any]) -> dict[str, Any]:
    """Values whose key (any part of the dotted name) looks like a secret are replaced."""
    return {
        k: REDACTED if any(m in k.lower() for m in SECRET_MARKERS) and v not in (None, "") else v
        for k, v in flat.items()
    }


def redact_overrides(args: list[str]) -> list[str]:
    """``+api_key=abc`` -> ``+api_key=<redacted>``: command lines as wandb and the report show them."""
    out = []
    for arg in args:
        key, eq, _ = arg.partition("=")
        out.append(f"{key}={REDACTED}" if eq and any(m in key.lower() for m in SECRET_MARKERS) else arg)
    return out


def run_tags(cfg: DictConfig) -> list[str]:
    """``<group>=<option>`` of each config group, then the user's ``wandb.tags``."""
    return [*(f"{g}={cfg[g].name}" for g in TAG_GROUPS if g in cfg and "name" in cfg[g]), *cfg.wandb.tags]


def group_name(sweep_dir: str | Path, *, machine: str | None = None) -> str:
    """The wandb group of a sweep: its directory's last two parts (``2026-11-24/10-00-00``), then
    a hash of its absolute path and the machine (SLURM's cluster name, else the host), so that the
    same relative path on two machines never merges two sweeps. ``run`` (a single run) stays as is."""
    if str(sweep_dir) == "run":
        return "run"
    path = Path(sweep_dir).absolute()
    machine = machine or os.environ.get("SLURM_CLUSTER_NAME") or socket.gethostname()
    digest = hashlib.sha256(f"{machine}:{path}".encode()).hexdigest()[:8]
    readable = "/".join(path.parts[-2:])[-(MAX_GROUP - 10) :]
    return f"{readable}-{digest}"


def check_wandb_names(cfg: DictConfig) -> None:
    """wandb's name limits, at compose time: tags and job_type <= 64 characters, name <= 128
    (the run name is the sweep tag, at most sweep.tag_max_len); the group is short by construction.
    With wandb.mode=disabled nothing reaches wandb, so nothing is limited."""
    if cfg.wandb.mode == "disabled":
        return
    for tag in run_tags(cfg):
        if len(tag) > MAX_TAG:
            raise ValueError(f"wandb tag {tag!r} has {len(tag)} characters; wandb allows at most {MAX_TAG}")
    if len(cfg.benchmark.name) > MAX_JOB_TYPE:
        raise ValueError(
            f"benchmark name {cfg.benchmark.name!r} (the wandb job_type) has {len(cfg.benchmark.name)} "
            f"characters; wandb allows at most {MAX_JOB_TYPE}"
        )
    if cfg.sweep.tag_max_len > MAX_NAME:
        raise ValueError(
            f"sweep.tag_max_len={cfg.sweep.tag_max_len}: the tag is the wandb run name, "
            f"which wandb limits to {MAX_NAME} characters"
        )


@dataclass(frozen=True)
class Chart:
    """A custom chart drawn from the cases table when it has these columns (by column, never by
    benchmark name): ``kind`` line (x, y, stroke), bar (x = label, y = value) or scatter."""

    kind: str
    x: str
    y: str
    stroke: str | None = None

    @property
    def key(self) -> str:
        return f"charts/{self.y}_vs_{self.x}"


CHARTS = (
    Chart("line", "size_bytes", "busbw_gbps", stroke="op"),  # collective: busbw vs message size
    Chart("line", "ring_size", "efficiency", stroke="seq_len"),  # attention: efficiency vs ring size
    Chart("line", "num_gpus", "tokens_per_s"),  # train
    Chart("bar", "case", "effective_gbps"),  # reshard: bandwidth per case
    Chart("bar", "strategy", "median_s"),  # refit: time per strategy
    Chart("scatter", "link_floor_s", "median_s"),  # any transfer: time against its floor
)


def cases_table(cases: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The cases' scalar fields as table columns (lists such as times_s stay in metrics.json)."""
    columns: list[str] = []
    for case in cases:
        for k, v in flatten(case).items():
            if isinstance(v, (int, float, str, bool)) and k not in columns:
                columns.append(k)
    return columns, [[flatten(case).get(c) for c in columns] for case in cases]


class NullRun:
    """Stands in for a wandb run when wandb is disabled or could not start."""

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.dir: str | None = None

    def log_cases(self, cases: list[dict[str, Any]]) -> None:
        pass

    def log_summary(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, *, failed: bool) -> None:
        pass


class WandbRun(NullRun):
    def __init__(self, run: Any) -> None:
        super().__init__()
        self._run = run
        self.dir = str(Path(run.dir).parent)  # .../wandb/offline-run-*/ (holds the .wandb log)

    def _tables(self, cases: list[dict[str, Any]]) -> dict[str, Any]:
        import wandb

        columns, rows = cases_table(cases)
        table = wandb.Table(columns=cast("list[str | int]", columns), data=rows)
        out: dict[str, Any] = {"cases": table}
        for chart in CHARTS:
            if chart.x in columns and chart.y in columns:
                title = f"{chart.y} vs {chart.x}"
                if chart.kind == "line":
                    out[chart.key] = wandb.plot.line(
                        table, chart.x, chart.y, title=title, stroke=chart.stroke if chart.stroke in columns else None
                    )
                elif chart.kind == "bar":
                    out[chart.key] = wandb.plot.bar(table, chart.x, chart.y, title=title)
                else:
                    out[chart.key] = wandb.plot.scatter(table, chart.x, chart.y, title=title)
        return out

    def log_cases(self, cases: list[dict[str, Any]]) -> None:
        """One history step per measured case (wandb's own charts of e.g. busbw over size); the
        last step also carries the cases table and its custom charts."""
        try:
            extra = self._tables(cases) if cases else {}
            for i, case in enumerate(cases):
                step = {k: v for k, v in flatten(case).items() if not isinstance(v, list)}
                self._run.log({**step, **(extra if i == len(cases) - 1 else {})})
        except Exception as err:
            self.error = f"wandb log: {err}"
            log.warning(self.error)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        try:
            for key, value in flatten(metrics).items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    self._run.summary[key] = value
        except Exception as err:  # never let wandb fail a benchmark
            self.error = f"wandb summary: {err}"
            log.warning(self.error)

    def finish(self, *, failed: bool) -> None:
        try:
            self._run.finish(exit_code=1 if failed else 0)
        except Exception as err:
            self.error = f"wandb finish: {err}"
            log.warning(self.error)


def remove_previous_runs(job_dir: Path) -> None:
    """A job that runs again in its directory (``sweep.force=true``, a resumed failure) replaces
    its previous offline run rather than leaving two runs of one job to be synced."""
    wandb_dir = job_dir / "wandb"
    for old in (*wandb_dir.glob("offline-run-*"), wandb_dir / "latest-run"):
        if old.is_symlink() or old.is_file():
            old.unlink()
        elif old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def start_run(cfg: DictConfig, *, job_dir: Path, tag: str, group: str, config: dict[str, Any]) -> NullRun:
    """A wandb run named ``tag`` in the sweep's group; WANDB_MODE in the environment wins over
    wandb.mode. ``group`` is the run group, as ``group_name`` makes it from the sweep directory."""
    mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
    if mode == "disabled":
        return NullRun()
    try:
        import wandb

        remove_previous_runs(job_dir)
        argv, sys.argv = sys.argv, [sys.argv[0], *redact_overrides(sys.argv[1:])]  # wandb records the args
        try:
            run = _init(wandb, cfg, job_dir=job_dir, tag=tag, group=group, config=config, mode=mode)
        finally:
            sys.argv = argv
        return WandbRun(run)
    except Exception as err:
        message = f"wandb init ({mode}): {type(err).__name__}: {err}"
        log.warning("%s; results are still written locally", message)
        return NullRun(error=message)


def _init(
    wandb: Any, cfg: DictConfig, *, job_dir: Path, tag: str, group: str, config: dict[str, Any], mode: str
) -> Any:
    """The run: the sweep's group, job_type = the benchmark, option tags, redacted config."""
    return wandb.init(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=group,
        name=tag,
        job_type=cfg.benchmark.name,
        tags=run_tags(cfg),
        config=redact(flatten(config)),
        dir=str(job_dir),
        mode=mode,
        reinit="create_new",
        settings=wandb.Settings(
            init_timeout=cfg.wandb.init_timeout_s, console="off", x_disable_stats=True, silent=True
        ),
    )


RANKING_RUN = "fastest"  # the run that holds the sweep's ranking
RANKING_DIR = ".fastest"  # its directory in the sweep (hidden: not a job's)


def log_ranking(
    sweep_dir: Path, *, group: str, wandb_cfg: dict[str, Any], columns: list[str], rows: list[list[Any]]
) -> str | None:
    """The sweep's ranking (``sweepbench.report.answer``) as the table ``fastest`` of a run named
    ``fastest`` (job_type ``ranking``) in the sweep's group, written under ``<sweep>/.fastest/``;
    its run directory, or None when wandb is disabled or failed (a warning, never an error)."""
    mode = os.environ.get("WANDB_MODE") or wandb_cfg.get("mode") or "offline"
    if mode == "disabled":
        return None
    job_dir = Path(sweep_dir) / RANKING_DIR
    try:
        import wandb

        remove_previous_runs(job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=wandb_cfg.get("project") or "sweepbench",
            entity=wandb_cfg.get("entity"),
            group=group,
            name=RANKING_RUN,
            job_type="ranking",
            dir=str(job_dir),
            mode=cast(Literal["online", "offline", "disabled", "shared"], mode),  # wandb.init checks the name
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        try:
            run.log({RANKING_RUN: wandb.Table(columns=cast("list[str | int]", columns), data=rows)})
        finally:
            run.finish()
        return str(Path(run.dir).parent)
    except Exception as err:
        log.warning("wandb ranking table: %s: %s", type(err).__name__, err)
        return None
