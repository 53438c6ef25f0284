"""The one registry every name -> code table is built on (sweepbench.core.Registry): an unknown
name is refused with the valid choices, a name is registered once, and declared code is imported
on its first lookup only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from sweepbench.core import Registry


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("b", 2)
    reg.add("a", 1)
    with pytest.raises(ValueError, match=r"^unknown thing 'c'; valid: a, b$"):
        reg.get("c")
    with pytest.raises(ValueError, match=r"^benchmark\.thing='c'; valid: a, b$"):
        reg.check("c", key="benchmark.thing")
    ordered: Registry[int] = Registry("step", ordered=True)
    ordered.add("none", 0)
    ordered.add("all", 1)
    with pytest.raises(ValueError, match=r"; valid: none, all$"):
        ordered.get("some")


def test_a_name_is_registered_once() -> None:
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    with pytest.raises(ValueError, match=r"^thing 'a' is already registered$"):
        reg.add("a", 2)
    reg.declare("b", "json:dumps")
    with pytest.raises(ValueError, match="'b' is already registered"):
        reg.add("b", 3)
    assert reg.get("a") == 1 and reg.names() == ("a", "b")


def test_declared_code_is_imported_on_first_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A "module:attr" entry imports its module on the first get; a "module" entry imports the
    module, which registers the name itself."""
    (tmp_path / "registry_probe_host.py").write_text("from sweepbench.core import Registry\nREG = Registry('probe')\n")
    (tmp_path / "registry_probe_attr.py").write_text("VALUE = object()\n")
    (tmp_path / "registry_probe_module.py").write_text(
        "from registry_probe_host import REG\n\n\n@REG.register('m')\ndef hello():\n    return 'hi'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    probes = ("registry_probe_host", "registry_probe_attr", "registry_probe_module")
    for name in probes:
        monkeypatch.delitem(sys.modules, name, raising=False)
    reg = importlib.import_module("registry_probe_host").REG
    reg.declare("a", "registry_probe_attr:VALUE")
    reg.declare("m", "registry_probe_module")
    reg.check("a")
    assert "a" in reg and "m" in reg and list(reg) == ["a", "m"]
    assert "registry_probe_attr" not in sys.modules and "registry_probe_module" not in sys.modules
    value = reg.get("a")
    assert value is sys.modules["registry_probe_attr"].VALUE and reg.get("a") is value
    assert "registry_probe_module" not in sys.modules
    assert reg.get("m")() == "hi" and "registry_probe_module" in sys.modules
    for name in probes:
        sys.modules.pop(name, None)


def test_collective_ops_and_cluster_watchers_are_registries() -> None:
    """The collective ops the engine runs are the ones the driver's checks list (ALL_OPS, kept
    torch-free), in the same order; an unknown op or cluster is one line naming the valid ones."""
    from sweepbench.collective.impls import ALL_OPS
    from sweepbench.collective.ops import OPS
    from sweepbench.slurm.watch import WATCHERS

    assert OPS.names() == tuple(ALL_OPS)
    assert WATCHERS.names() == ("local", "slurm")
    with pytest.raises(ValueError, match="unknown collective op 'gather'; valid: all_reduce, all_gather"):
        OPS["gather"]
    with pytest.raises(ValueError, match="unknown cluster watcher 'pbs'; valid: local, slurm"):
        WATCHERS["pbs"]
