"""The typed config: ``typed(config)`` is the ``sections.Config`` an entry point builds once.

From a ConfigDict or nested mapping: every schema key and no other, each value checked by its
section, then the rules between keys (``messages.ConfigError`` names the first bad key).
``as_dict`` gives its JSON values, ``replace`` a copy with some dotted keys changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trip_jax.config import checks
from trip_jax.config.migrate import flatten, nest
from trip_jax.config.sections import Config


def typed(config: Any) -> Config:
    """The checked ``Config`` of ``config`` (a ConfigDict or nested mapping); a ``Config`` is
    returned as it is."""
    if isinstance(config, Config):
        return config
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    flat = flatten(values)
    checks.check_keys(flat)
    built = Config.from_mapping(values)
    checks.check_rules(flat)
    return built


def as_dict(config: Config) -> dict[str, Any]:
    """``config`` as plain JSON values, sections nested, in the schema's key order."""
    return dataclasses.asdict(config)


def replace(config: Config, changes: Mapping[str, Any]) -> Config:
    """``config`` with the dotted keys of ``changes`` ("data.fold": 2) set, checked anew."""
    return typed(nest({**flatten(as_dict(config)), **changes}))
