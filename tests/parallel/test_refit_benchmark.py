"""The refit benchmark through the CLI: presets at tiny size, the strategy x mode grid verified
bit for bit, link context reported, bad layouts refused before any rank starts, megatron-core's
refit side by side with ours, and a clear error where megatron-core is not installed."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SweepRun, base_env, run_sweepbench

QUICK = ["benchmark.warmup=1", "benchmark.iters=2", "benchmark.probe_bytes=65536"]
PRESETS = ["tp2-tp1", "tp2-tp4", "tp2pp2-tp4pp1"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """Every strategy x both modes for tp2 -> tp1, plus the default (refit is the default)."""
    root = tmp_path_factory.mktemp("refit_grid")
    run = run_sweepbench(["parallelism=tp2", "benchmark.strategy=send_recv,broadcast,naive",
                          "mode=collocated,non_collocated", *QUICK], sweep_dir=root / "sweep")
    assert run.rc == 0, run.describe()
    return run


def test_every_strategy_and_mode_refits_and_verifies(grid: SweepRun) -> None:
    metrics = grid.all_metrics()
    assert len(metrics) == 6
    seen = set()
    for tag, m in metrics.items():
        assert m["benchmark"] == "refit" and m["status"] == "ok" and m["verified"] is True, tag
        case = m["results"]["cases"][0]
        seen.add((case["strategy"], m["config"]["mode"]["name"]))
        assert len(case["times_s"]) == 2 and case["min_s"] <= case["median_s"] <= case["max_s"]
        assert case["model_bytes"] > 0 and case["moved_bytes"] + case["local_bytes"] >= case["model_bytes"]
        assert case["p2p_gbps"] > 0 and case["link_floor_s"] > 0 and case["fraction_of_link"] > 0
        assert case["impl"] == "sweepbench" and case["method"] == case["strategy"]
        assert tag.startswith(f"refit-tp1-{case['strategy']}-sweepbench_tiny_tp2_")
        steps = grid.progress(tag)
        assert len(steps) == 2 and steps[0].startswith("1/2: link probed") and "verified and timed" in steps[1], steps
    assert seen == {(s, mode) for s in ("send_recv", "broadcast", "naive")
                    for mode in ("collocated", "non_collocated")}


def test_modes_place_layouts(grid: SweepRun) -> None:
    """Collocated tp2 -> tp1 keeps half of the model local on 2 ranks; non-collocated adds the
    inference rank (world 3) and moves every byte."""
    for m in grid.all_metrics().values():
        case = m["results"]["cases"][0]
        if m["config"]["mode"]["name"] == "collocated":
            assert m["world_size"] == 2 and case["local_bytes"] > 0
        else:
            assert m["world_size"] == 3 and case["local_bytes"] == 0
            assert case["moved_bytes"] == case["model_bytes"]


def test_naive_moves_more_than_planned(grid: SweepRun) -> None:
    by_strategy = {}
    for m in grid.all_metrics().values():
        if m["config"]["mode"]["name"] == "collocated":
            case = m["results"]["cases"][0]
            by_strategy[case["strategy"]] = case["wire_bytes"]
    assert by_strategy["naive"] > by_strategy["send_recv"]


def test_presets_run_at_tiny_size(tmp_path: Path) -> None:
    run = run_sweepbench([f"experiment={','.join(PRESETS)}", "model=tiny", "backend=gloo", *QUICK],
                         sweep_dir=tmp_path / "presets")
    assert run.rc == 0, run.describe()
    layouts = {m["results"]["cases"][0]["train_layout"] + " -> " + m["results"]["cases"][0]["inference_layout"]
               for m in run.all_metrics().values() if m["verified"]}
    assert len(layouts) == len(PRESETS)
    moe = run_sweepbench(["experiment=ep2-ep4", "model=tiny_moe", "backend=gloo", *QUICK],
                         sweep_dir=tmp_path / "moe", multirun=False)
    assert moe.rc == 0, moe.describe()
    (m,) = moe.all_metrics().values()
    assert m["verified"] and m["config"]["parallelism"]["ep"] == 2 and m["config"]["benchmark"]["inference"] == "ep4"


@pytest.mark.parametrize(("overrides", "needle"), [
    (["benchmark.inference=tp3x"], "benchmark.inference='tp3x' is not a layout"),
    (["benchmark.inference=tp3"], "benchmark.inference.tp=3 does not divide model.num_heads=8"),
    (["benchmark.inference=ep2"], "benchmark.inference.ep=2 needs an MoE model"),
    (["experiment=ep2-ep4", "model=tiny"], "parallelism.ep=2 needs an MoE model"),
    (["benchmark.inference=pp3"], "benchmark.inference.pp=3 does not divide model.num_layers=4"),
    (["benchmark.strategy=scatter"], "benchmark.strategy='scatter'"),
    (["benchmark.balance=random"], "benchmark.balance='random'"),
    (["experiment=large"], "backend=nvshmem needs a GPU"),
    (["benchmark.strategy=ipc", "backend=gloo"], "benchmark.strategy=ipc needs GPUs"),
    (["benchmark.impl=deepspeed"], "benchmark.impl='deepspeed'; valid: megatron, sweepbench"),
    (["experiment=ep2-ep4", "model=tiny_moe", "backend=gloo", "benchmark.impl=megatron"],
     "benchmark.impl=megatron does not support ep>1"),
])
def test_impossible_layouts_are_refused_before_any_rank(tmp_path: Path, overrides: list[str], needle: str) -> None:
    run = run_sweepbench(overrides, sweep_dir=tmp_path / "bad")
    assert run.rc == 2, run.describe()
    assert needle in run.stderr, run.stderr
    assert not (tmp_path / "bad").exists()


def test_megatron_side_by_side(tmp_path: Path) -> None:
    """benchmark.impl=sweepbench,megatron: one sweep, both verified after every iteration, one
    results.csv with an impl column."""
    run = run_sweepbench(["parallelism=tp2", "benchmark.strategy=pipeline", "benchmark.impl=sweepbench,megatron",
                          *QUICK], sweep_dir=tmp_path / "peers")
    assert run.rc == 0, run.describe()
    cases = {m["results"]["cases"][0]["impl"]: m["results"]["cases"][0]
             for m in run.all_metrics().values() if m["status"] == "ok" and m["verified"]}
    assert set(cases) == {"sweepbench", "megatron"}
    assert cases["sweepbench"]["method"] == "pipeline" and "megatron-core" in cases["megatron"]["method"]
    assert cases["megatron"]["model_bytes"] == cases["sweepbench"]["model_bytes"]
    assert cases["megatron"]["wire_bytes"] > 0 and len(cases["megatron"]["times_s"]) == 2
    with open(run.sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["impl"] for r in rows) == ["megatron", "sweepbench"]
    assert all(r["status"] == "ok" for r in rows)


BLOCK_MEGATRON = """import importlib.abc, sys
class _NoMegatron(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "megatron" or name.startswith("megatron."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoMegatron())
"""


def test_missing_megatron_is_one_line(tmp_path: Path) -> None:
    """Without megatron-core (an interpreter whose import system refuses it), impl=megatron is one
    line naming the install command: on the driver (exit 2, before any rank) and on import."""
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCK_MEGATRON)
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path / 'block'}:{env.get('PYTHONPATH', '')}".rstrip(":")
    run = run_sweepbench(["parallelism=tp2", "benchmark.impl=megatron"], sweep_dir=tmp_path / "none", env=env)
    assert run.rc == 2, run.describe()
    line = 'benchmark.impl=megatron needs megatron.core, which is not installed; install it with: pip install "sweepbench[megatron]"'
    errors = [x for x in run.stderr.splitlines() if "error" in x.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"sweepbench: error: {line}"), run.stderr
    assert not (tmp_path / "none").exists()
    proc = subprocess.run([sys.executable, "-c", "import sweepbench.parallel.megatron_refit"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"ImportError: {line}", proc.stderr


def test_user_config_dir_on_the_search_path(tmp_path: Path) -> None:
    """A model from the user's own config directory, added through Hydra's search path."""
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "my_model.yaml").write_text(
        "defaults: [base_model]\nname: my_model\nnum_layers: 2\nhidden_size: 32\nnum_heads: 4\n"
        "num_kv_heads: 2\nffn_hidden_size: 64\nvocab_size: 128\ndtype: float32\nseq_len: 64\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    run = run_sweepbench([search, "model=my_model", "parallelism=tp2", *QUICK], sweep_dir=tmp_path / "mine")
    assert run.rc == 0, run.describe()
    (m,) = run.all_metrics().values()
    assert m["tag"].startswith("refit-tp1-send_recv-sweepbench_my_model_tp2_") and m["verified"]
    assert m["config"]["model"]["num_kv_heads"] == 2
    bad = run_sweepbench([search, "model=my_model", "parallelism=tp4"], sweep_dir=tmp_path / "bad")
    assert bad.rc == 2 and "parallelism.tp=4 does not divide model.num_kv_heads=2" in bad.stderr
