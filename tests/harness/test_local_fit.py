"""Local jobs that cannot fit this machine are refused before any rank starts, with one line
and the switch that forces them: far more ranks than cores, more memory than the host has."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweepbench.launch.preflight import check_local_fit, host_memory_bytes, validate

from ..conftest import run_sweepbench

CASES = {
    "ranks": (["benchmark=collective", "parallelism.dp=512"],
              "world_size=1024 is far beyond this machine's", "launch.max_local_ranks=1024"),
    "memory": (["experiment=tp2-tp1", "backend=gloo"], "more than this machine's", "launch.skip_memory_check=true"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_with_one_line_and_a_way_to_force(tmp_path: Path, case: str) -> None:
    args, what, force = CASES[case]
    run = run_sweepbench(args, sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: ") and what in lines[0] and force in lines[0]
    assert not (tmp_path / "sweep").exists()


def test_the_switches_force_it(compose) -> None:
    cfg = compose("parallelism.dp=512", "launch.max_local_ranks=1024")
    check_local_fit(cfg, validate(cfg))
    cfg = compose("benchmark=refit", "experiment=tp2-tp1", "backend=gloo", "launch.skip_memory_check=true")
    check_local_fit(cfg, validate(cfg))
    cfg = compose("benchmark=refit", "experiment=tp2-tp1", "backend=gloo")  # the estimate is real: 8B weights do not fit
    with pytest.raises(ValueError, match="skip_memory_check"):
        check_local_fit(cfg, validate(cfg))
    assert host_memory_bytes() > 1 << 30


def test_timeout_must_be_finite(compose) -> None:
    for bad in ("nan", "inf"):
        with pytest.raises(ValueError, match=rf"^launch.timeout_s={bad} must be a finite number"):
            validate(compose(f"launch.timeout_s={bad}"))
