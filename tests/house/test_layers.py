"""Imports point down the house, and no module imports itself round a circle.

Each module's imports are read from its source (``ast``: module level, inside functions, and
under ``TYPE_CHECKING``), so a lazy import cannot hide an upward edge. A layer may import its own
layer and any layer below it, and no exception is kept: an upward edge means a module sits in the
wrong folder."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom. Engines know one domain and nothing of sweeps; config holds the knobs (schemas,
# field checks) every layer reads; core holds the types every layer shares and imports nothing.
LAYERS: list[tuple[str, ...]] = [
    ("sweepbench.__main__", "sweepbench.cli"),
    ("hydra_plugins.sweepbench_sweeper",),
    # slurm: a sweep's jobs on SLURM, submitted beside the local driver (it names jobs with
    # sweep.tags) and run as rank tasks by job.py, so it shares the sweep's layer
    ("sweepbench.sweep", "sweepbench.job", "sweepbench.slurm"),
    ("sweepbench.launch",),
    ("sweepbench.report",),  # above the plugins: a report calls each benchmark's hooks by its name
    ("sweepbench.benchmarks",),
    ("sweepbench.train",),
    ("sweepbench.attention",),
    ("sweepbench.parallel",),
    ("sweepbench.collective",),  # the collective engine: ops as nccl-tests measures them, nccl-tests, impls
    ("sweepbench.draw",),  # the drawing kit (figures, units) engines, plugins and the report draw with
    ("sweepbench.measure",),
    ("sweepbench.record",),  # below measure: whatever writes a file writes it with record.atomic
    ("sweepbench.config",),
    ("sweepbench.core", "sweepbench"),  # "sweepbench": the package's __init__ only, never a prefix
]
ROOT_PACKAGES = {"sweepbench"}  # matched exactly: a new module must be given a layer


def modules() -> dict[str, Path]:
    found = {}
    for top in ("sweepbench", "hydra_plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The sweepbench modules ``name`` imports (``from pkg import submodule`` counts as the submodule)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module or ""
            )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        # a module's own packages are imported before it anyway (``import sweepbench.benchmarks as
        # pkg`` to walk its folder is no circle)
        out.update(t for t in targets if t in known and not name.startswith(t + ".") and t != name)
    return out


def layer_of(name: str) -> int:
    """The layer's index, -1 for a module no layer names."""
    matches = [
        prefix
        for layer in LAYERS
        for prefix in layer
        if name == prefix or (prefix not in ROOT_PACKAGES and name.startswith(prefix + "."))
    ]
    if not matches:
        return -1
    best = max(matches, key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) < 0] == []


def test_a_module_no_layer_names_is_caught() -> None:
    assert layer_of("sweepbench.newfolder.thing") == -1 and layer_of("sweepbench.stray") == -1
    assert layer_of("sweepbench") == len(LAYERS) - 1 and layer_of("sweepbench.report.page") >= 0


def test_imports_point_down() -> None:
    upward = [
        f"{a} (layer {LAYERS[layer_of(a)][0]}) imports {b} (layer {LAYERS[layer_of(b)][0]})"
        for a, targets in graph().items()
        for b in sorted(targets)
        if layer_of(b) < layer_of(a)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_core_imports_nothing_of_sweepbench() -> None:
    assert graph()["sweepbench.core"] == set()


def find_circle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def test_no_import_circles() -> None:
    circle = find_circle(graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_checks_catch_what_they_guard() -> None:
    """The checks themselves: a circle is found, and an upward edge would be reported."""
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None
    assert layer_of("sweepbench.parallel.comm") > layer_of("sweepbench.benchmarks.refit")
    assert layer_of("sweepbench.core") == len(LAYERS) - 1


def test_the_drawing_of_the_house_is_current() -> None:
    """docs/house.md (bench/house_graph.py) draws what the imports are now, so a move shows there."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "bench/house_graph.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    drawn = (ROOT / "docs" / "house.md").read_text()
    assert '["sweepbench.report"]' in drawn and '["sweepbench.benchmarks"]' in drawn
    assert drawn.index('["sweepbench.report"]') < drawn.index('["sweepbench.benchmarks"]')  # report above plugins
