"""Frozen-dataclass configs built from dicts or ConfigDicts, refusing misspelt keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def dataclass_from_mapping(cls: type[T], values: Mapping[str, Any]) -> T:
    """Returns ``cls(**values)``; a key that is not a field of ``cls`` is a KeyError naming it."""
    values = dict(values)
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise KeyError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**values)
