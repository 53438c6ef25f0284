"""Sweep tags: stable for a config, different for any other config, filesystem-safe, bounded,
and shaped by sweep.tag_format."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from sweepbench.config.schema import OUTPUT_ONLY_KEYS
from sweepbench.launch.preflight import validate
from sweepbench.sweep.tags import HASH_LEN, config_hash, make_tag, tagged_config

from tests.conftest import COLLECTIVE, planned_tag, run_sweepbench

SAFE = re.compile(r"^[A-Za-z0-9._=-]+$")
HEX = re.compile(rf"^[0-9a-f]{{{HASH_LEN}}}$")


@pytest.fixture(scope="module")
def base_cfg(compose):
    return compose()


def tag_of(cfg) -> str:
    return make_tag(cfg, world_size=validate(cfg))


def test_default_tag_shape(compose) -> None:
    cfg = compose()
    tag = tag_of(cfg)
    # collective's tag_groups leave out mode, which means nothing to it
    assert tag == f"collective-torch_tiny_tp2_auto_ws2_{config_hash(cfg)}"
    assert HEX.match(tag[-HASH_LEN:])


def test_same_config_same_tag(compose) -> None:
    a = planned_tag(compose, "model=small", "parallelism=tp4", "benchmark.iters=3")
    b = planned_tag(compose, "model=small", "parallelism=tp4", "benchmark.iters=3")
    c = planned_tag(compose, "benchmark.iters=3", "parallelism=tp4", "model=small")  # order of overrides
    assert a == b == c


def test_hash_covers_the_config_without_output_only_keys(compose) -> None:
    cfg = compose()
    tagged = tagged_config(cfg)
    assert not OUTPUT_ONLY_KEYS & set(tagged)
    assert {"benchmark", "model", "parallelism", "backend", "mode", "fault"} <= set(tagged)
    assert HEX.match(config_hash(cfg))


def test_every_group_option_gives_its_own_tag(compose) -> None:
    from tests.config.test_config import group_options

    jobs = [[f"model={m}"] for m in group_options("model")]
    jobs += [[f"parallelism={p}", *(["model=tiny_moe"] if p.startswith("ep") else [])]
             for p in group_options("parallelism")]
    jobs += [[f"mode={m}"] for m in group_options("mode")] + [["backend=gloo"], ["backend=auto"]]
    defaults = {"model=tiny", "parallelism=tp2", "mode=collocated", "backend=auto"}
    default_tag = planned_tag(compose)
    tags = {tuple(job): planned_tag(compose, *job) for job in jobs}
    for job, tag in tags.items():
        assert SAFE.match(tag), tag
        if set(job) <= defaults:
            assert tag == default_tag, job
    others = [tag for job, tag in tags.items() if not set(job) <= defaults]
    assert len(others) == len(set(others)) == len(jobs) - len(defaults), sorted(others)
    assert default_tag not in others


FIELD_CHANGES = ["benchmark.iters=4", "benchmark.warmup=2", "benchmark.ops=[all_reduce]", "benchmark.dtype=bfloat16",
                 "benchmark.max_bytes=8192", "model.seq_len=256", "model.dtype=bfloat16", "model.hidden_size=128",
                 "parallelism.dp=1", "fault.kind=raise", "fault.rank=1"]


@pytest.mark.parametrize("override", FIELD_CHANGES)
def test_field_override_changes_only_the_hash(compose, override: str) -> None:
    base = planned_tag(compose, "parallelism=tp2", "parallelism.dp=2", "benchmark.iters=3")
    changed = planned_tag(compose, "parallelism=tp2", "parallelism.dp=2", "benchmark.iters=3", override)
    if override == "parallelism.dp=1":  # changes the world size, which the readable part shows
        assert changed.replace("_ws2_", "_ws4_")[:-HASH_LEN] == base[:-HASH_LEN]
    else:
        assert changed[:-HASH_LEN] == base[:-HASH_LEN]
    assert changed[-HASH_LEN:] != base[-HASH_LEN:]


@pytest.mark.parametrize("override", ["wandb.project=elsewhere", "wandb.mode=disabled", "wandb.tags=[a,b]",
                                      "launch.timeout_s=5", "launch.master_addr=localhost", "sweep.force=true",
                                      "sweep.dry_run=true", "sweep.tag_max_len=100"])
def test_output_only_keys_keep_the_tag(compose, override: str) -> None:
    """Resume and sweep.force=true rely on this: rerunning a job must land in the same dir."""
    assert planned_tag(compose, override) == planned_tag(compose)


def test_tag_format_override(compose) -> None:
    default = compose()
    cfg = compose("sweep.tag_format='{model}-{parallelism}-ws{world_size}-{hash}'")
    assert tag_of(cfg) == f"tiny-tp2-ws2-{config_hash(default)}"
    cfg = compose("sweep.tag_format='{hash}.{benchmark}.{backend}'")
    assert tag_of(cfg) == f"{config_hash(default)}.collective.auto"
    cfg = compose("sweep.tag_format='{hash}.{benchmark}.{mode}'")  # a group the benchmark does not tag
    assert tag_of(cfg) == f"{config_hash(default)}.collective"
    cfg = compose("sweep.tag_format='run {backend}/{model}: {hash}'")
    assert tag_of(cfg) == f"run-auto-tiny-{config_hash(default)}"


def test_unsafe_names_are_sanitised_and_still_distinct(compose, tmp_path: Path) -> None:
    a = compose("model.name='a/b c'")
    b = compose("model.name='a b/c'")
    ta, tb = tag_of(a), tag_of(b)
    assert SAFE.match(ta) and SAFE.match(tb)
    assert ta[:-HASH_LEN] == tb[:-HASH_LEN] == "collective-torch_a-b-c_tp2_auto_ws2_"
    assert ta != tb  # same readable part, different config: the hash tells them apart
    (tmp_path / ta).mkdir()
    assert [p.name for p in tmp_path.iterdir()] == [ta]


@pytest.mark.parametrize("max_len", [8, 20, 64, 120])
def test_tag_length_is_bounded(compose, max_len: int) -> None:
    # wandb off: wandb's own name limits (a 64-character tag) would refuse this model name first
    cfg = compose(f"model.name={'x' * 300}", f"sweep.tag_max_len={max_len}", "wandb.mode=disabled")
    tag = tag_of(cfg)
    assert len(tag) == max_len  # the readable part is cut ...
    assert tag.endswith(config_hash(cfg))  # ... never the hash


_field = st.sampled_from(["{benchmark}", "{detail}", "{model}", "{parallelism}", "{backend}", "{mode}", "{world_size}"])
_text = st.text(st.characters(exclude_characters="{}$"), max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.lists(st.one_of(_field, _text), max_size=5), tail=st.lists(st.one_of(_field, _text), max_size=3),
       name=st.text(st.characters(exclude_characters="{}$\\'"), min_size=1, max_size=200),
       max_len=st.integers(min_value=0, max_value=300))
def test_any_tag_is_filesystem_safe_and_bounded(base_cfg, head, tail, name, max_len) -> None:
    cfg = copy.deepcopy(base_cfg)
    OmegaConf.update(cfg, "model.name", name)
    OmegaConf.update(cfg, "sweep.tag_format", "".join(head) + "{hash}" + "".join(tail))
    OmegaConf.update(cfg, "sweep.tag_max_len", max_len)
    try:
        tag = make_tag(cfg, world_size=2)
    except ValueError as err:
        assert f"sweep.tag_max_len={max_len} is too short" in str(err)
        assert max_len < HASH_LEN + len("".join(tail))
        return
    assert SAFE.match(tag), tag
    assert tag not in (".", "..")
    assert len(tag) <= max_len
    assert config_hash(cfg) in tag


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.text(st.characters(exclude_characters="{}$"), max_size=40),
       b=st.text(st.characters(exclude_characters="{}$"), max_size=40))
def test_different_configs_different_tags(base_cfg, a, b) -> None:
    cfg_a, cfg_b = copy.deepcopy(base_cfg), copy.deepcopy(base_cfg)
    OmegaConf.update(cfg_a, "model.name", a)
    OmegaConf.update(cfg_b, "model.name", b)
    assert (make_tag(cfg_a, world_size=2) == make_tag(cfg_b, world_size=2)) == (a == b)


def test_tag_format_override_through_cli(compose, tmp_path: Path) -> None:
    """A dry run with sweep.tag_format names the jobs by it; the hash is the one this process
    computes for the same job (stable across processes)."""
    fmt = "sweep.tag_format='{parallelism}-ws{world_size}-{hash}'"
    run = run_sweepbench([COLLECTIVE, "parallelism=tp1,tp4", "benchmark.iters=3", fmt, "sweep.dry_run=true"],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    for par, ws in (("tp1", 1), ("tp4", 4)):
        expected = planned_tag(compose, f"parallelism={par}", "benchmark.iters=3", fmt)
        assert expected.startswith(f"{par}-ws{ws}-")
        assert expected[-HASH_LEN:] == planned_tag(compose, f"parallelism={par}", "benchmark.iters=3")[-HASH_LEN:]
        assert expected in run.stdout, run.stdout
    assert not (tmp_path / "sweep").exists()
