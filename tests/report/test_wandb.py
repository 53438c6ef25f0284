"""Each job's wandb run read back from the offline run (wandb's own reader): group, job_type,
tags, redacted config, the cases table and its custom charts; a forced rerun replaces the run;
wandb's name limits at compose time; the workspace view built offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweepbench.record.wandb_run import group_name, redact, redact_overrides
from sweepbench.report.load import load_sweep

from ..conftest import SweepRun, run_sweepbench, wandb_inspect
from .conftest import SECRET, SECRETS_SWEEP, sweepbench_cli


def records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of an offline run, by ``wandb leet inspect --json``."""
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def run_record(recs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r["run"] for r in recs if r.get("type") == "run")


def charts(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Custom charts: ``_wandb.visualize.<key>`` config updates."""
    out = {}
    for r in recs:
        for key, value in ((r.get("config") or {}).get("update") or {}).items():
            if key.startswith("_wandb.visualize."):
                out[key.removeprefix("_wandb.visualize.")] = value["panel_config"]
    return out


def summary_tables(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Summary entries that are tables, with their JSON file read from the run's files."""
    summary = wandb_inspect(run_dir)["summary"]
    return {
        key: json.loads((run_dir / "files" / value["path"]).read_text())
        for key, value in summary.items()
        if isinstance(value, dict) and value.get("_type") == "table-file"
    }


def _ok_run(sweep: SweepRun) -> tuple[dict[str, Any], Path]:
    metrics = next(m for m in sweep.all_metrics().values() if m["status"] == "ok")
    return metrics, Path(metrics["wandb"]["dir"])


def test_run_identity(report_sweeps: dict[str, SweepRun]) -> None:
    for name, sweep in report_sweeps.items():
        env = sweep.env_json(next(iter(sweep.all_metrics())))
        groups = set()
        for tag, metrics in sweep.all_metrics().items():
            run = run_record(records(metrics["wandb"]["dir"]))
            assert run["display_name"] == tag and run["job_type"] == name
            groups.add(run["run_group"])
            assert {
                "benchmark=" + name,
                f"parallelism={metrics['config']['parallelism']['name']}",
                f"model={metrics['config']['model']['name']}",
            } <= set(run["tags"])
            assert all(len(t) <= 64 for t in run["tags"])
            # every benchmark's record of how its GPUs ran the timed samples: none on a CPU, per rank
            # and in results.csv's columns
            if metrics["status"] == "ok":
                assert metrics["gpu_state"]["per_rank"] == [None] * metrics["world_size"], metrics["gpu_state"]
        gpu_columns = ["gpu_sm_mhz_median", "gpu_power_w_median", "gpu_power_capped_pct", "gpu_temperature_c_max"]
        assert sweep.results()[gpu_columns].isna().all().all()
        assert "GPUs in the timed samples" not in sweep.stdout  # the closing line only where GPUs recorded
        # one group per sweep: the sweep's own, unique to its absolute path on this machine
        assert groups == {group_name(sweep.sweep_dir, machine=env["host"])}
        assert len(groups.pop()) <= 128


def test_cases_table_and_line_chart(report_sweeps: dict[str, SweepRun]) -> None:
    metrics, run_dir = _ok_run(report_sweeps["collective"])
    recs = records(run_dir)
    tables = summary_tables(run_dir)
    cases = metrics["results"]["cases"]
    table = tables["cases"]
    assert len(table["data"]) == len(cases)
    col = {c: i for i, c in enumerate(table["columns"])}
    assert "times_s" not in col  # per-iteration lists stay in metrics.json
    for row, case in zip(table["data"], cases):
        assert row[col["op"]] == case["op"] and row[col["size_bytes"]] == case["size_bytes"]
        assert row[col["busbw_gbps"]] == pytest.approx(case["busbw_gbps"])
    chart = charts(recs)["charts/busbw_gbps_vs_size_bytes"]
    assert chart["panelDefId"] == "wandb/line/v0"
    assert chart["fieldSettings"] == {"x": "size_bytes", "y": "busbw_gbps", "stroke": "op"}
    assert "charts/busbw_gbps_vs_size_bytes_table" in tables


def test_bar_and_scatter_charts(report_sweeps: dict[str, SweepRun]) -> None:
    metrics, run_dir = _ok_run(report_sweeps["reshard"])
    found = charts(records(run_dir))
    assert found["charts/effective_gbps_vs_case"]["panelDefId"] == "wandb/bar/v0"
    assert found["charts/effective_gbps_vs_case"]["fieldSettings"] == {"label": "case", "value": "effective_gbps"}
    assert found["charts/median_s_vs_link_floor_s"]["panelDefId"] == "wandb/scatter/v0"
    assert "charts/busbw_gbps_vs_size_bytes" not in found  # a chart only where its columns are


@pytest.fixture(scope="module")
def forced(secrets_sweep: SweepRun) -> tuple[SweepRun, SweepRun]:
    """The sweep with secret-looking config keys, run again with sweep.force=true."""
    first = secrets_sweep
    first_runs = sorted(p.name for p in first.sweep_dir.glob("*/wandb/offline-run-*"))
    second = run_sweepbench([*SECRETS_SWEEP, "sweep.force=true"], sweep_dir=first.sweep_dir, cwd=first.sweep_dir.parent)
    assert second.rc == 0, second.describe()
    assert first_runs and sorted(p.name for p in first.sweep_dir.glob("*/wandb/offline-run-*")) != first_runs
    return first, second


def test_force_replaces_the_previous_run(forced: tuple[SweepRun, SweepRun]) -> None:
    _, second = forced
    for job in second.job_dirs():
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, runs
        assert str(runs[0]) == second.metrics(job.name)["wandb"]["dir"]


def test_secrets_stay_out_of_wandb_and_the_report(forced: tuple[SweepRun, SweepRun]) -> None:
    _, second = forced
    (job,) = second.job_dirs()
    recs = records(second.metrics(job.name)["wandb"]["dir"])
    config = run_record(recs)["config"]["update"]
    assert config["wandb_api_key"] == "<redacted>" and config["launch.my_token"] == "<redacted>"
    assert config["model.num_heads"] == 8  # the rest as is
    for path in job.glob("wandb/**/*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    report = (second.sweep_dir / "report.html").read_text()
    assert SECRET not in report and "+wandb_api_key=&lt;redacted&gt;" in report


def test_redaction_rules() -> None:
    flat = {"a.api_key": "x", "b.Token": "y", "password": "z", "model.num_heads": 8, "c.secret_name": None}
    assert redact(flat) == {
        "a.api_key": "<redacted>",
        "b.Token": "<redacted>",
        "password": "<redacted>",
        "model.num_heads": 8,
        "c.secret_name": None,
    }
    assert redact_overrides(["+my_key=1", "model=tiny", "-m", "x.password=2"]) == [
        "+my_key=<redacted>",
        "model=tiny",
        "-m",
        "x.password=<redacted>",
    ]


def test_group_name() -> None:
    a = group_name("multirun/2026-11-24/10-00-00", machine="nodeA")
    assert a.startswith("2026-11-24/10-00-00-") and a == group_name("multirun/2026-11-24/10-00-00", machine="nodeA")
    assert a != group_name("multirun/2026-11-24/10-00-00", machine="nodeB")
    assert len(group_name("/" + "x" * 300 + "/" + "y" * 300, machine="m")) <= 128
    assert group_name("run") == "run"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["wandb.tags=[" + "t" * 65 + "]"], "has 65 characters; wandb allows at most 64"),
        (["sweep.tag_max_len=200"], "which wandb limits to 128 characters"),
    ],
)
def test_wandb_name_limits_at_compose_time(compose, overrides: list[str], message: str) -> None:
    from sweepbench.launch.preflight import validate

    with pytest.raises(ValueError, match=message):
        validate(compose("parallelism=tp1", *overrides))


def test_workspace_spec_offline(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    from sweepbench.report.workspace import build_workspace, run_id, sweep_group

    link = tmp_path / "the-sweep"  # the report reached through another path: the group is the runs' own
    link.symlink_to(report_sweeps["collective"].sweep_dir)
    sweep = load_sweep(link)
    ok = next(j for j in sweep.jobs if j["status"] == "ok")
    assert sweep_group(sweep) == run_record(records(ok["wandb"]["dir"]))["run_group"]
    view = build_workspace(sweep, entity="me", project="sweepbench", baseline=ok["tag"])
    spec = json.loads(view._to_model().model_dump_json(by_alias=True))  # what .save() would send
    rs = view.runset_settings
    assert sweep_group(sweep) in str(rs.filters)
    assert [g.name for g in rs.groupby] == ["fault.kind"]  # the key the sweep varied
    assert rs.baseline_run == run_id(ok) and rs.pinned_runs == [run_id(ok)]
    assert run_id(ok) == Path(ok["wandb"]["dir"]).name.rsplit("-", 1)[1]
    opening, section = view.sections
    # it opens with the chart of what the sweep varied (fault.kind only: a bar per value) and the answer
    assert opening.name == "collective: what the sweep varied" and opening.is_open
    bar, answer = opening.panels
    assert type(bar).__name__ == "BarPlot" and bar.groupby.name == "fault.kind"
    assert "fault.kind=raise (failed)" in answer.markdown
    assert section.name == "collective"
    kinds = [type(p).__name__ for p in section.panels]
    assert kinds == ["LinePlot", "BarPlot", "ParallelCoordinatesPlot"]
    line = section.panels[0]
    assert line.x == "size_bytes" and line.y == ["busbw_gbps"] and line.log_x
    assert spec["entity"] == "me" and spec["displayName"].startswith("sweepbench ")
    with pytest.raises(ValueError, match="is not the tag of a job"):
        build_workspace(sweep, entity="me", project="p", baseline="nope")


def test_workspace_opens_with_the_varied_axes(answer_sweeps: dict[str, SweepRun]) -> None:
    from sweepbench.report.workspace import build_workspace

    view = build_workspace(load_sweep(answer_sweeps["attention"].sweep_dir), entity="me", project="p")
    json.loads(view._to_model().model_dump_json(by_alias=True))  # a spec .save() can send
    opening = view.sections[0]
    assert opening.name == "attention: what the sweep varied"
    scatter, answer = opening.panels
    assert type(scatter).__name__ == "ScatterPlot" and scatter.title == "fwd+bwd ms vs seq_len"
    assert scatter.x.name == "benchmark.seq_len" and scatter.y.name == "total_median_ms"
    assert "seq_len=64: " in answer.markdown and "seq_len=128: " in answer.markdown
    assert {g.name for g in view.runset_settings.groupby} == {"benchmark.impl", "benchmark.seq_len"}


def test_ranking_table_in_the_sweeps_group(answer_sweeps: dict[str, SweepRun]) -> None:
    from sweepbench.report.answer import COLUMNS

    sweep = answer_sweeps["slow"]
    (run_dir,) = (sweep.sweep_dir / ".fastest" / "wandb").glob("offline-run-*")
    run = run_record(records(run_dir))
    groups = {m["wandb"]["group"] for m in sweep.all_metrics().values()}
    assert run["run_group"] in groups and len(groups) == 1
    assert run["display_name"] == "fastest" and run["job_type"] == "ranking"
    table = summary_tables(run_dir)["fastest"]
    assert table["columns"] == list(COLUMNS)
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(r["rank"], r["config"]) for r in rows] == [(1, "fault.factor=1"), (2, "fault.factor=4")]
    assert rows[0]["verdict"] == "fastest" and rows[1]["verdict"] == "slower" and rows[1]["p_value"] < 0.002
    assert rows[1]["ratio"] > 1.5 and rows[0]["tag"] in sweep.all_metrics()


def test_report_wandb_offline_publishes_nothing(
    report_sweeps: dict[str, SweepRun], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    proc = sweepbench_cli("report", report_sweeps["refit"].sweep_dir, "-o", tmp_path / "r.html", "--wandb")
    assert proc.returncode == 0, proc.stderr
    assert "publishing a workspace needs wandb online and a login" in proc.stderr
    assert "nothing was published" in proc.stderr
    assert (tmp_path / "r.html").is_file()


def test_cli_help_lists_both_commands() -> None:
    proc = sweepbench_cli("report", "--help")
    assert proc.returncode == 0 and "--wandb" in proc.stdout and "--save-jobs" in proc.stdout
    proc = sweepbench_cli("compare", "--help")
    assert proc.returncode == 0 and "--fail-on-regression" in proc.stdout and "--on" in proc.stdout


def test_workspace_takes_the_ranking_the_report_made(
    answer_sweeps: dict[str, SweepRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --wandb` ranks once: the workspace's answer panel is the ranking handed to it, and no
    ranking is made again while the view is built."""
    import sweepbench.report.answer as answer_mod
    from sweepbench.report.workspace import build_workspace

    sweep = load_sweep(answer_sweeps["attention"].sweep_dir)
    made = answer_mod.answer_jobs(sweep.jobs)
    expected = build_workspace(sweep, entity="me", project="p").sections[0].panels[1].markdown

    def ranked_again(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the workspace ranked the sweep again")

    monkeypatch.setattr(answer_mod, "answer_benchmark", ranked_again)
    view = build_workspace(sweep, entity="me", project="p", answers=made)
    assert view.sections[0].panels[1].markdown == expected
