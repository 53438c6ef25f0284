"""Config groups compose and validate; every bad input fails before any rank starts, with one
clear line naming the bad value: through Hydra's compose API and through the CLI (exit 2)."""

from __future__ import annotations

import importlib.resources
import math
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from sweepbench.config.validate import GPU_BACKENDS, visible_gpus
from sweepbench.launch.preflight import validate

from tests.conftest import COLLECTIVE, run_sweepbench

GROUPS = ("model", "parallelism", "backend", "mode", "benchmark")


def group_options(group: str) -> list[str]:
    """Every option of a config group, as shipped in the sweepbench.conf package."""
    folder = importlib.resources.files("sweepbench.conf") / group
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


ALL_OPTIONS = [(g, o) for g in GROUPS for o in group_options(g)]


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert group_options(group), f"conf/{group}/ holds no option"
    assert {"tiny", "tiny_moe"} <= set(group_options("model"))
    assert {"auto", "gloo", "nccl", "nvshmem"} == set(group_options("backend"))
    assert {"collocated", "non_collocated"} == set(group_options("mode"))
    assert "collective" in group_options("benchmark")


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_option_composes_and_validates(compose, group: str, option: str) -> None:
    overrides = [f"{group}={option}"]
    cfg = compose(*overrides)
    assert cfg[group].name == option, f"{group}={option} composes to a node named {cfg[group].name!r}"
    # the schema is applied: every group node is typed, so a typo can not slip through
    assert OmegaConf.get_type(cfg[group]) is not dict
    if group == "parallelism" and cfg.parallelism.ep > 1 and cfg.model.num_experts == 0:
        overrides.append("model=tiny_moe")  # expert parallelism needs an MoE model
        cfg = compose(*overrides)
    if group == "benchmark" and option == "attention":  # it splits the sequence: the default tp2 is refused
        with pytest.raises(ValueError, match="use parallelism=cp1/cp2/cp4/cp8, not tp2"):
            validate(cfg)
        overrides.append("parallelism=cp2")
        cfg = compose(*overrides)
    if group == "backend" and option in GPU_BACKENDS:
        if visible_gpus() == 0:
            with pytest.raises(ValueError, match=rf"^backend={option} needs a GPU, but none is visible"):
                validate(cfg)
            return
        cfg = compose(*overrides, "parallelism=tp1")
    world_size = validate(cfg)
    if group == "benchmark":  # a benchmark may need more ranks than the layout (refit: two layouts)
        from sweepbench.benchmarks.registry import get_benchmark

        assert world_size == get_benchmark(option).world_size(cfg) >= 1
    else:  # the collective benchmark runs on the parallelism's ranks
        p = cfg.parallelism
        assert world_size == p.tp * p.pp * p.ep * p.dp * p.cp


@pytest.mark.parametrize(("option", "world_size"), [("tp1", 1), ("tp2", 2), ("tp4pp2", 8), ("tp2pp2", 4),
                                                     ("cp4", 4), ("dp2", 2)])
def test_world_size_is_product_of_degrees(compose, option: str, world_size: int) -> None:
    assert validate(compose(f"parallelism={option}")) == world_size


def test_auto_backend_resolves_to_gloo_without_gpu(compose) -> None:
    from sweepbench.config.validate import resolve_backend

    cfg = compose()
    assert cfg.backend.name == "auto"
    assert resolve_backend(cfg.backend.name) == ("nccl" if visible_gpus() else "gloo")


# ---------------------------------------------------------------- invalid combinations (API)

INVALID = {
    # tp must divide the model's heads (and every other split dimension)
    "tp-heads": (["model=small", "parallelism=tp8"],
                 ["parallelism.tp=8", "model.num_heads=12", "valid tp: divisors of 12"]),
    "tp-heads-tiny": (["parallelism.tp=3"], ["parallelism.tp=3", "model.num_heads=8"]),
    "tp-vocab": (["model.vocab_size=500", "parallelism=tp8"], ["parallelism.tp=8", "model.vocab_size=500"]),
    # pp must divide the layers
    "pp-layers": (["model=llama3_8b", "parallelism=pp2", "parallelism.pp=3"],
                  ["parallelism.pp=3", "model.num_layers=32"]),
    "pp-layers-tiny": (["parallelism=tp2pp2", "model.num_layers=3"], ["parallelism.pp=2", "model.num_layers=3"]),
    # ep needs an MoE model, and must divide its experts
    "ep-dense": (["parallelism=ep2"], ["parallelism.ep=2", "model=tiny", "dense"]),
    "ep-dense-llama": (["model=llama3_8b", "parallelism=ep4"], ["parallelism.ep=4", "model=llama3_8b", "dense"]),
    "ep-experts": (["model=tiny_moe", "parallelism=ep4", "model.num_experts=6"],
                   ["parallelism.ep=4", "model.num_experts=6"]),
    "ep-experts-mixtral": (["model=mixtral_8x7b", "parallelism=ep2", "parallelism.ep=3"],
                           ["parallelism.ep=3", "model.num_experts=8"]),
    "cp-seq": (["parallelism=cp8", "model.seq_len=100"], ["parallelism.cp=8", "model.seq_len=100"]),
    # model shape
    "hidden-heads": (["model.hidden_size=60"], ["model.hidden_size=60", "model.num_heads=8"]),
    "heads-kv": (["model.num_kv_heads=3"], ["model.num_heads=8", "model.num_kv_heads=3"]),
    "top-k": (["model=tiny_moe", "model.moe_top_k=9"], ["model.moe_top_k=9", "num_experts=8"]),
    "dtype": (["model.dtype=float64"], ["model.dtype='float64'", "bfloat16"]),
    # choices
    "backend-name": (["backend.name=mpi"], ["backend.name='mpi'", "gloo"]),
    "mode-name": (["mode.name=sideways"], ["mode.name='sideways'", "non_collocated"]),
    "fault-kind": (["fault.kind=explode"], ["fault.kind='explode'", "hang"]),
    "fault-rank": (["fault.rank=2"], ["fault.rank=2", "0..1"]),
    "wandb-mode": (["wandb.mode=sometimes"], ["wandb.mode='sometimes'", "offline"]),
    "ranks-per-node": (["launch.ranks_per_node=3"], ["launch.ranks_per_node=3", "world_size=2"]),
    "timeout": (["launch.timeout_s=0"], ["launch.timeout_s=0"]),
    "warmup": (["benchmark.warmup=-1"], ["benchmark.warmup=-1", ">= 0"]),
    # benchmark
    "unknown-op": (["benchmark.ops=[all_reduce,all_reduse]"], ["'all_reduse'", "valid ops", "all_gather"]),
    "unknown-benchmark": (["benchmark.name=nosuch"], ["unknown benchmark 'nosuch'", "collective"]),
    "min-bytes": (["benchmark.min_bytes=0"], ["benchmark.min_bytes=0"]),
    "min-over-max": (["benchmark.min_bytes=8192", "benchmark.max_bytes=4096"],
                     ["benchmark.min_bytes=8192", "max_bytes=4096"]),
    "step-factor": (["benchmark.step_factor=1"], ["benchmark.step_factor=1"]),
    "bench-dtype": (["benchmark.dtype=int8"], ["benchmark.dtype='int8'"]),
    # tags
    "tag-field": (["sweep.tag_format='{model}_{nope}_{hash}'"], ["sweep.tag_format=", "'nope'", "valid fields"]),
    "tag-no-hash": (["sweep.tag_format='{model}'"], ["sweep.tag_format=", "must contain {hash}"]),
    "tag-too-short": (["sweep.tag_max_len=5"], ["sweep.tag_max_len=5", "at least 8"]),
}
if visible_gpus() == 0:
    INVALID.update({f"no-gpu-{b}": ([f"backend={b}"], [f"backend={b} needs a GPU", "none is visible", "gloo"])
                    for b in GPU_BACKENDS})


def _validate_and_tag(cfg) -> None:
    from sweepbench.sweep.tags import make_tag

    make_tag(cfg, world_size=validate(cfg))


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_combination_names_bad_value(compose, case: str) -> None:
    overrides, expected = INVALID[case]
    cfg = compose(*overrides)  # composes fine: these are cross-field errors, caught by validate
    with pytest.raises(ValueError) as info:
        _validate_and_tag(cfg)
    message = str(info.value)
    assert "\n" not in message, f"not one line: {message!r}"
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


POSITIVE_KEYS = [
    *(f"parallelism.{k}" for k in ("tp", "pp", "ep", "dp", "cp")),
    *(f"model.{k}" for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                             "vocab_size", "seq_len")),
    "benchmark.iters",
]


@pytest.mark.parametrize("value", [0, -2])
@pytest.mark.parametrize("key", POSITIVE_KEYS)
def test_non_positive_count_is_rejected(compose, key: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"^{key}={value} must be a positive integer$"):
        validate(compose(f"{key}={value}"))


COMPOSE_ERRORS = {
    # typo'd keys: the schemas know every field
    "benchmark.iterz=3": "iterz",
    "parallelism.tpp=2": "tpp",
    "model.num_head=4": "num_head",
    "sweep.forse=true": "forse",
    "wandb.projekt=x": "projekt",
    "launch.timeout=5": "launch.timeout",
    # wrong types
    "benchmark.iters=abc": "benchmark.iters=abc",
    "parallelism.tp=two": "parallelism.tp=two",
    "model.hidden_size=1.5": "model.hidden_size=1.5",
    "sweep.force=maybe": "sweep.force=maybe",
    "launch.timeout_s=soon": "launch.timeout_s=soon",
    # unknown options
    "model=nosuch": "model/nosuch",
    "benchmark=nosuch": "benchmark/nosuch",
}


@pytest.mark.parametrize("override", sorted(COMPOSE_ERRORS))
def test_typo_or_wrong_type_fails_at_compose(compose, override: str) -> None:
    with pytest.raises(HydraException) as info:
        compose(override)
    err = info.value
    text = f"{err} {err.__cause__ or ''}"
    assert COMPOSE_ERRORS[override] in text, text


def test_typo_in_an_option_file_fails_at_compose(compose, tmp_path: Path) -> None:
    """A group option's YAML extends its schema: a misspelt field fails when composed."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "typo.yaml").write_text(
        "defaults: [base_model]\nname: typo\nnum_layer: 4\nhidden_size: 64\nnum_heads: 8\n"
        "num_kv_heads: 8\nffn_hidden_size: 256\nvocab_size: 512\n")
    (tmp_path / "model" / "fine.yaml").write_text((tmp_path / "model" / "typo.yaml").read_text()
                                                  .replace("typo", "fine").replace("num_layer:", "num_layers:"))
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    assert validate(compose(searchpath, "model=fine")) == 2  # the search path works ...
    with pytest.raises(HydraException, match="num_layer"):  # ... and the typo is caught
        compose(searchpath, "model=typo")


# ---------------------------------------------------------------- the same, through the CLI

CLI_ERRORS = {
    "tp-heads-in-2nd-job": ([COLLECTIVE, "parallelism=tp2,tp8", "model=small"],
                            ["parallelism.tp=8", "model.num_heads=12", "parallelism=tp8 model=small)"]),
    "typo-key": ([COLLECTIVE, "benchmark.iterz=3"], ["unknown key benchmark.iterz: did you mean benchmark.iters?"]),
    "typo-group": ([COLLECTIVE, "parallelsm=tp2"], ["unknown key parallelsm: did you mean parallelism?"]),
    "typo-option": ([COLLECTIVE, "benchmark=colective"],
                    ["benchmark=colective is not an option of benchmark; did you mean collective? "
                     "(valid: attention, collective, refit, reshard, train)"]),
}
if visible_gpus() == 0:
    # a GPU job among CPU jobs is skipped (tests/harness/test_where_it_runs.py); refusing is the switch's
    CLI_ERRORS["nccl-no-gpu"] = ([COLLECTIVE, "backend=gloo,nccl", "parallelism=tp1", "sweep.on_unfit=refuse"],
                                 ["backend=nccl needs a GPU"])


@pytest.mark.parametrize("case", sorted(CLI_ERRORS))
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    args, expected = CLI_ERRORS[case]
    cwd = tmp_path / "cwd"
    sweep_dir = tmp_path / "sweep"
    run = run_sweepbench(args, sweep_dir=sweep_dir, cwd=cwd)
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{run.stderr}"
    assert lines[0].startswith("sweepbench: error: "), lines[0]
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    assert "base_" not in lines[0] and "search path" not in lines[0], lines[0]  # no internals
    assert not sweep_dir.exists(), "a bad sweep created its sweep dir"
    assert list(cwd.iterdir()) == [], f"a bad sweep wrote {list(cwd.iterdir())}"
    assert "Launching" not in run.stdout, "a job was launched before the sweep was validated"


def test_schema_defaults_are_sane() -> None:
    """The dataclass defaults a YAML option inherits are themselves valid values."""
    from sweepbench.config.schema import FaultConfig, LaunchConfig, SweepConfig, WandbConfig

    assert FaultConfig().kind == "none"
    assert LaunchConfig().timeout_s > 0 and math.isfinite(LaunchConfig().timeout_s)
    assert "{hash}" in SweepConfig().tag_format
    assert WandbConfig().mode == "offline"
