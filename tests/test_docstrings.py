"""Module docstrings are contracts of at most five lines; reasoning and figures live in docs/."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = sorted(p for d in ("trip_jax", "benchmarks", "configs") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstring_is_at_most_five_lines(path, parse_python):
    doc = ast.get_docstring(parse_python(path.read_text()), clean=False) or ""
    lines = doc.strip("\n").splitlines()
    assert len(lines) <= 5, f"{path.relative_to(ROOT)}: module docstring of {len(lines)} lines"
