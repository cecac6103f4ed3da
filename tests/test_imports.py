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
# A module may import modules of its own floor or lower ones. A name stands for a module or a
# whole sub-package of trip_jax (the longest name that matches decides: "data.schema" before
# "data"); "benchmarks" for every benchmark. The role groups follow the data's path: the encoder
# families (registry, units and Flax encoders: jax and flax only; the config's model types, the
# tokenizers and the padding row read them) under the config schema, the command line (``cli``, with the terminal it sets up) and the process-wide runtime
# under the data (files -> pairs -> arrays, layouts, the batch contract), the original
# implementation's pieces (``reference``: jax, flax and optax only) under the model and training
# that choose them, the model on the data, training on the model, evaluation on training's
# checkpoints and steps; the training loop and the commands (datatools: the data's side tools)
# at the top.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("data.schema",),
    ("models.registry", "models.contract", "models.families", "models.bert", "models.deberta",
     "models.layer_stack", "models.segments", "models.activations"),
    ("config",),
    ("cli", "runtime.terminal"),
    ("runtime",),
    ("data",),
    ("reference",),
    ("models",),
    ("interop",),
    ("training",),
    ("evaluation", "scoring"),
    ("train", "cross_validate"),
    ("main", "score", "convert", "run_summary", "datatools"),
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
    """The floor of a module: that of the longest ``FLOORS`` name its dotted name starts with."""
    parts = name.split(".")
    if parts[0] == "benchmarks":
        return FLOOR["benchmarks"]
    for size in range(len(parts) - 1, 0, -1):
        key = ".".join(parts[1:1 + size])
        if key in FLOOR:
            return FLOOR[key]
    raise AssertionError(f"{name} has no floor in tests/test_imports.py FLOORS; add it")


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
    assert "trip_jax.train" not in edges["trip_jax.evaluation.evaluate"]
    assert "trip_jax.train" not in edges["trip_jax.evaluation.predict"]
    assert "trip_jax.evaluation.evaluate" in edges["trip_jax.evaluation.predict"]
    assert {"trip_jax.evaluation.evaluate", "trip_jax.data.input_pipeline",
            "trip_jax.training.step"} <= edges["trip_jax.train"]
    assert "trip_jax.training.step" in edges["benchmarks.harness"]
    for name, targets in edges.items():
        if name.startswith(("trip_jax.data.", "trip_jax.models.", "trip_jax.runtime.")):
            assert not [t for t in targets if t.startswith(
                ("trip_jax.training.", "trip_jax.evaluation.", "trip_jax.train"))], name


def test_an_import_inside_a_function_is_seen():
    source = "def f():\n    from trip_jax import train\n    import trip_jax.data.schema\n"
    found = imports_of(source, "trip_jax.data.features", all_modules())
    assert found == {"trip_jax.train", "trip_jax.data.schema"}
    assert floor("trip_jax.data.features") < floor("trip_jax.train")
