"""The package's import structure: data flows one way.

Every import inside ``trip_jax`` and ``benchmarks`` (at module level or inside a function) is read
from the source; no module may import one on a higher floor of ``FLOORS``, and no import cycle
may exist. The floors, lowest first:
"""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# A module may import modules of its own floor or lower ones. "data", "models" and "training"
# stand for their whole sub-packages.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("schema", "config", "runtime", "distributed", "paths", "cli", "selection",
     "checksums", "workdir_lock"),
    ("batch_contract",),
    ("data", "models", "metrics", "decoding", "losses", "optimizers", "explain", "reports",
     "sharding", "prediction_formats", "curated"),
    ("builders", "protocol", "checkpoints", "metric_log", "random_baseline", "run_summary",
     "prediction_matching"),
    ("input_pipeline",),
    ("evaluate",),
    ("training",),
    ("train", "predict"),
    ("main", "score"),
    ("benchmarks",),
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def module_name(path: pathlib.Path) -> str:
    """``trip_jax/data/features.py`` -> ``trip_jax.data.features``."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, pathlib.Path]:
    """Every module of trip_jax and benchmarks, by dotted name."""
    paths = sorted(REPO.glob("trip_jax/**/*.py")) + sorted(REPO.glob("benchmarks/*.py"))
    return {module_name(p): p for p in paths}


def imports_of(source: str, name: str, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (its ``source``) imports, anywhere in
    its code."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        # Package __init__ files hold nothing: "from trip_jax import train" is an edge to train.
        found.update(n for n in names if n in modules and modules[n].name != "__init__.py")
    return found - {name}


def graph() -> dict[str, set[str]]:
    """{module: the modules it imports} (package __init__ files left out)."""
    modules = all_modules()
    return {name: imports_of(path.read_text(), name, modules) for name, path in modules.items()
            if path.name != "__init__.py"}


def floor(name: str) -> int:
    """The floor of a module (its sub-package's for data and models)."""
    parts = name.split(".")
    key = "benchmarks" if parts[0] == "benchmarks" else parts[1]
    if key not in FLOOR:
        raise AssertionError(f"{name} has no floor in tests/test_imports.py FLOORS; add it")
    return FLOOR[key]


def test_every_module_has_a_floor():
    for name in graph():
        floor(name)


def test_no_module_imports_a_higher_floor():
    upward = sorted(f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
                    for a, targets in graph().items() for b in targets if floor(b) > floor(a))
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = graph()
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges.get(name, ())):
            if state.get(target) == "open":
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_the_floors_are_what_the_layout_promises():
    edges = graph()
    training = {"trip_jax.train", "trip_jax.training.state", "trip_jax.training.step"}
    assert not training & edges["trip_jax.evaluate"]
    assert not training & edges["trip_jax.predict"]
    assert "trip_jax.evaluate" in edges["trip_jax.predict"]
    assert {"trip_jax.evaluate", "trip_jax.input_pipeline",
            "trip_jax.training.step"} <= edges["trip_jax.train"]
    assert "trip_jax.training.step" in edges["benchmarks.harness"]
    for name, targets in edges.items():
        if name.startswith(("trip_jax.data.", "trip_jax.models.", "trip_jax.metrics")):
            assert not targets & {"trip_jax.train", "trip_jax.evaluate", "trip_jax.predict",
                                  "trip_jax.input_pipeline"}, name


def test_an_import_inside_a_function_is_seen():
    source = "def f():\n    from trip_jax import train\n    import trip_jax.schema\n"
    found = imports_of(source, "trip_jax.data.features", all_modules())
    assert found == {"trip_jax.train", "trip_jax.schema"}
    assert floor("trip_jax.data.features") < floor("trip_jax.train")
