"""A process's table of built JAX pieces (trainers, eval steps), so that runs, folds, members
and checkpoints of one model trace and lower each of them once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# What ``reuse_built`` keeps: (key, built) pairs, the most recently used last.
_BUILT: list[tuple[tuple, Any]] = []
KEEP_BUILT = 8


def reuse_built(key: tuple, build: Callable[[], Any]) -> Any:
    """``build()``, or what it returned for a key equal to ``key`` (compared with ``==``: a
    Flax model holding a transformers config cannot be hashed); the ``KEEP_BUILT`` most recently
    used are kept. A key must hold everything the built value depends on."""
    for index, (held, built) in enumerate(_BUILT):
        if held == key:
            _BUILT.append(_BUILT.pop(index))
            return built
    built = build()
    _BUILT.append((key, built))
    del _BUILT[:-KEEP_BUILT]
    return built
