"""Software environments as a sweep axis: ``launch.python=A,B`` starts each job's ranks with that
interpreter; env.json records what the ranks ran with (rank 0's own capture), and the interpreter
is part of the tag. Two real venvs: this one, and one with another version of rich."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..conftest import TINY, planned_tag, run_sweepbench
from .venvs import make_venv, pip_install

OTHER_RICH = "13.9.4"


def test_launch_python_is_a_sweep_axis(tmp_path: Path, compose) -> None:
    import rich  # noqa: F401  (this environment's version, to compare with)
    from importlib.metadata import version

    other = make_venv(tmp_path / "oldrich")
    pip_install(other, "--no-deps", f"rich=={OTHER_RICH}")
    assert version("rich") != OTHER_RICH
    pythons = {"this": sys.executable, "other": str(other)}
    sweep_dir = tmp_path / "sweep"
    run = run_sweepbench([*TINY, "parallelism=tp1", f"launch.python={pythons['this']},{pythons['other']}"],
                         sweep_dir=sweep_dir)
    assert run.rc == 0, run.describe()
    tags = {name: planned_tag(compose, *TINY, "parallelism=tp1", f"launch.python={p}") for name, p in pythons.items()}
    assert tags["this"] != tags["other"] and "-py=oldrich_" in tags["other"]
    assert tags["this"] != planned_tag(compose, *TINY, "parallelism=tp1")  # the interpreter changes the hash
    for name, python in pythons.items():
        env = json.loads((sweep_dir / tags[name] / "env.json").read_text())
        assert env["executable"] == python
        assert env["packages"]["rich"] == (OTHER_RICH if name == "other" else version("rich"))
        assert env["packages"]["torch"] and env["sweepbench"]["version"]
        assert "captured_by" not in env  # rank 0's capture, not the driver's
        # the driver's own interpreter: forked from its warm one (launch.preload); another: started
        metrics = json.loads((sweep_dir / tags[name] / "metrics.json").read_text())
        assert metrics["rank_start"] == ("fresh" if name == "other" else "forked"), metrics["rank_start"]
