"""The package's import structure: data flows one way.

Every import inside ``trip_jax`` and ``benchmarks`` (at module level or inside a function) is read
from the source; no module may import one on a higher floor of ``FLOORS``, and no import cycle
may exist. The floors, lowest first:
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable

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
# checkpoints and steps, the compile-only check (``compile``) on the steps training builds; the
# training loop and the commands (datatools: the data's side tools)
# at the top.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("data.schema",),
    ("encoder_registry", "models.families", "models.layer_stack",
     "models.segments", "models.activations", "models.relative_positions"),
    ("config",),
    ("cli", "runtime.terminal"),
    ("runtime",),
    ("data",),
    ("reference",),
    ("models",),
    ("interop",),
    ("training",),
    ("evaluation", "scoring", "compile"),
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


def imports_of(tree: ast.Module, name: str, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (its parsed source, ``tree``) imports,
    anywhere in its code."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        # Package __init__ files hold nothing: "from trip_jax import train" is an edge to train.
        found.update(n for n in names if n in modules and modules[n].name != "__init__.py")
    return found - {name}


def graph(parse: Callable[[str], ast.Module]) -> dict[str, set[str]]:
    """{module: the modules it imports} (package __init__ files left out), the sources parsed
    with ``parse`` (the ``parse_python`` fixture)."""
    modules = all_modules()
    return {name: imports_of(parse(path.read_text()), name, modules)
            for name, path in modules.items() if path.name != "__init__.py"}


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


def test_every_module_has_a_floor(parse_python):
    for name in graph(parse_python):
        floor(name)


def test_no_module_imports_a_higher_floor(parse_python):
    upward = sorted(f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
                    for a, targets in graph(parse_python).items() for b in targets
                    if floor(b) > floor(a))
    assert not upward, "\n".join(upward)


def test_no_import_cycle(parse_python):
    edges = graph(parse_python)
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


def test_the_floors_are_what_the_layout_promises(parse_python):
    edges = graph(parse_python)
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


def test_an_import_inside_a_function_is_seen(parse_python):
    source = "def f():\n    from trip_jax import train\n    import trip_jax.data.schema\n"
    found = imports_of(parse_python(source), "trip_jax.data.features", all_modules())
    assert found == {"trip_jax.train", "trip_jax.data.schema"}
    assert floor("trip_jax.data.features") < floor("trip_jax.train")


# What a mistake on the command line must not import: the check path of every command reads its
# flags and config with absl, ml_collections and the config schema alone (issue 54: an answer in
# a second or two, not after JAX's import).
HEAVY = ("jax", "flax", "transformers", "torch", "orbax", "optax", "tokenizers", "grain",
         "spacy", "tensorflow", "trip_jax.data.input_pipeline", "trip_jax.models",
         "trip_jax.train", "trip_jax.training.checkpoints", "trip_jax.evaluation.evaluate")
# The encoder families' registry, which the config's allowed model types read: plain Python, no
# family unit or Flax module until one is asked for (issue 55).
LIGHT = ("trip_jax.models", "trip_jax.encoder_registry")
# Runs module ``sys.argv[1]`` as ``python -m`` with the rest of argv, then prints its exit
# status and the HEAVY modules it imported as JSON on the real stderr.
PROBE = """
import json, runpy, sys
heavy = json.loads(sys.argv[1])
sys.argv = sys.argv[2:]
code = None
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print("PROBE " + json.dumps({"code": code, "loaded": loaded}), file=sys.__stderr__)
"""


def probe(*argv: str, env: dict[str, str] | None = None) -> tuple[int, list[str], list[str]]:
    """Runs ``python -m ARGV`` in a subprocess: its exit status, the HEAVY modules it imported
    (but the LIGHT ones) and its other stderr lines."""
    import json
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), *argv], cwd=REPO,
                            env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=120)
    lines = result.stderr.splitlines()
    found = [json.loads(line[len("PROBE "):]) for line in lines if line.startswith("PROBE ")]
    assert found, result.stderr[-2000:]
    loaded = [m for m in found[0]["loaded"] if m not in LIGHT]
    return found[0]["code"], loaded, [l for l in lines if not l.startswith("PROBE ")]


@pytest.mark.parametrize("case", ["missing config", "misspelt key", "bad value", "help",
                                  "missing data", "untrained workdir"])
def test_a_mistake_in_main_imports_nothing_heavy(case, tmp_path):
    workdir = tmp_path / "run"
    main = ["trip_jax.main", f"--workdir={workdir}"]
    tiny = [*main, "--config=configs/tiny.py"]
    argv, status, says = {
        "missing config": ([*main, "--config=configs/nope.py"], 2, "configs/nope.py"),
        "misspelt key": ([*tiny, "--config.train.learnig_rate=1"], 2, "learnig_rate"),
        "bad value": ([*tiny, "--config.train.learning_rate=abc"], 2, "learning_rate"),
        "help": (["trip_jax.main", "--help"], 0, None),
        "missing data": ([*tiny, f"--config.data.data_dir={tmp_path / 'no_data'}"], 1,
                         "no_data: no such directory"),
        "untrained workdir": ([*tiny, "--mode=predict", "--input=pairs.jsonl"], 1,
                              f"no checkpoint 'selected' in {workdir / 'checkpoints'}"),
    }[case]
    code, loaded, lines = probe(*argv)
    assert code == status, lines
    assert loaded == [], loaded
    if says is not None:
        assert lines == [next(l for l in lines if l.startswith("error: "))]
        assert says in lines[0]
    assert not workdir.exists()  # nothing written, not even the lock


@pytest.mark.parametrize("argv", [
    ["trip_jax.score", "--predictions=/no/such/file.jsonl", "--out=/no/out"],
    ["trip_jax.convert", "--authors_model=/no/such/classifiers.pth", "--workdir=/no/w"],
    ["trip_jax.run_summary", "/no/such/run"],
    ["trip_jax.datatools", "stats", "--data_dir=/no/such/data"],
])
def test_a_mistake_in_another_command_imports_nothing_heavy(argv):
    code, loaded, lines = probe(*argv)
    assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert loaded == [], loaded


def test_a_mesh_for_other_devices_is_refused_before_the_modes_imports(tmp_path):
    # The devices are JAX's: it is imported, nothing else heavy is (flax, transformers, torch,
    # orbax, the pipeline...), so the line comes in a second or two.
    workdir = tmp_path / "run"
    code, loaded, lines = probe("trip_jax.main", f"--workdir={workdir}",
                                "--config=configs/tiny.py", "--config.mesh.data=2")
    assert code == 2 and lines == [next(l for l in lines if l.startswith("error: "))], lines
    assert "--config.mesh" in lines[0] and "data=2" in lines[0]
    assert "jax" in loaded
    assert [m for m in loaded if m != "jax" and not m.startswith("jax.")] == []
    assert not workdir.exists()
