"""The decoding sweep of cross-validation, ``cv.sweep``: ``KEY=V1,V2;KEY2=V3,V4`` (crossed).

``combinations(text)`` -> every crossed {"decoding.KEY": value} (the first key varies slowest;
``[{}]`` for ""), ValueError in one line naming the key or value; ``label(combination)`` is its
name in tables, e.g. ``min_flip_probability=0.9, conflict_state_threshold=0.95``.
"""

from __future__ import annotations

import itertools
from typing import Any

from trip_jax.config.sections import KEYS

DECODING_KEYS = tuple(k.removeprefix("decoding.") for k in KEYS if k.startswith("decoding."))


def parse(text: str) -> dict[str, list[Any]]:
    """{"decoding.KEY": [typed values]} of ``text`` in its order (module docstring)."""
    out: dict[str, list[Any]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, listed = part.partition("=")
        dotted = f"decoding.{name.strip().removeprefix('decoding.')}"
        if dotted not in KEYS or not listed.strip():
            raise ValueError(f"KEY=V1,V2;KEY=... with each KEY one of {', '.join(DECODING_KEYS)}"
                             f"; {part!r} is not")
        if dotted in out:
            raise ValueError(f"each key once; {dotted} is named twice")
        kind = type(KEYS[dotted].default)
        out[dotted] = []
        for raw in (v.strip() for v in listed.split(",")):
            value = _typed(raw, kind)
            problem = f"a {kind.__name__}" if value is None else KEYS[dotted].problem(value)
            if problem:
                raise ValueError(f"{dotted} {problem}, not {raw!r}")
            out[dotted].append(value)
    return out


def combinations(text: str) -> list[dict[str, Any]]:
    """Every combination of the values of ``text`` (module docstring)."""
    swept = parse(text)
    return [dict(zip(swept, values)) for values in itertools.product(*swept.values())]


def label(combination: dict[str, Any]) -> str:
    """``KEY=VALUE, KEY=VALUE`` without the ``decoding.`` prefix ("as configured" for {})."""
    return ", ".join(f"{k.removeprefix('decoding.')}={v:g}" if isinstance(v, float) else
                     f"{k.removeprefix('decoding.')}={v}" for k, v in combination.items()
                     ) or "as configured"


def _typed(raw: str, kind: type) -> Any:
    """``raw`` as a value of ``kind`` (bool: true/false/1/0), None when it is not one."""
    if kind is bool:
        return {"true": True, "1": True, "false": False, "0": False}.get(raw.lower())
    try:
        return kind(raw)
    except ValueError:
        return None
