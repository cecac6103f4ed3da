"""How a config key is declared: a dataclass field with its default, type, allowed values and help.

``option(default, help, rule)`` declares one key of a ``Section`` (its type: the annotation, a
``Literal`` for choices); ``keys(cls)`` lists every key by dotted path, ``config_dict(cls)`` builds
the ConfigDict of the defaults, and constructing a ``Section`` checks its values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ml_collections

from trip_jax.config.messages import ConfigError, bad_choice, bad_value

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Rule:
    """The allowed values of one key: ``test(value)`` is True for them; ``allowed`` says which."""

    test: Callable[[Any], bool]
    allowed: str


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def at_least(low: float) -> Rule:
    """Numbers >= ``low``."""
    return Rule(lambda v: _is_number(v) and v >= low, f">= {low}")


def above(low: float) -> Rule:
    """Numbers > ``low``."""
    return Rule(lambda v: _is_number(v) and v > low, f"> {low}")


def interval(text: str) -> Rule:
    """Numbers in an interval written as in mathematics: ``"[0, 1)"``, ``"(0, 1)"``, ..."""
    match = re.fullmatch(r"([\[(])\s*([^,]+),\s*([^\])]+)([\])])", text)
    if not match:
        raise ValueError(f"not an interval: {text!r}")
    opening, low, high, closing = match.groups()
    low, high = float(low), float(high)

    def test(value: Any) -> bool:
        if not _is_number(value):
            return False
        above_low = value >= low if opening == "[" else value > low
        below_high = value <= high if closing == "]" else value < high
        return above_low and below_high

    return Rule(test, f"in {text}")


def _is_regex(value: Any) -> bool:
    """A string that compiles as a Python regular expression."""
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


POSITIVE_INT = at_least(1)
NON_NEGATIVE = at_least(0)
DROPOUT = interval("[0, 1)")
REGEX = Rule(_is_regex, "a Python regular expression ('': none)")
# -1: every device the other mesh axis leaves (sharding.mesh_shape).
MESH_SIZE = Rule(lambda v: _is_number(v) and (v == -1 or v >= 1),
                 "-1 (every device the other axis leaves) or >= 1")


def option(default: Any, help: str, rule: Rule | None = None) -> Any:
    """A section field: ``default``, one line of ``help`` and the ``rule`` of its values.

    A dataclass ``default`` (a nested section) is copied for each instance.
    """
    metadata = {"help": help, "rule": rule}
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def choices(annotation: Any) -> tuple | None:
    """The values of a ``Literal[...]`` annotation, else None."""
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else None


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as the schema declares it."""

    name: str                # dotted path, e.g. "model.tiered.cells"
    default: Any
    annotation: Any
    help: str
    rule: Rule | None
    choices: tuple | None    # the Literal's values, for choice keys

    def problem(self, value: Any) -> str | None:
        """What is allowed, when ``value`` is not; None when it is."""
        if self.choices is not None and value not in self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.rule is not None and not self.rule.test(value):
            return self.rule.allowed
        return None


@functools.cache
def keys(cls: type, prefix: str = "") -> dict[str, Key]:
    """Every key of section ``cls`` and of its nested sections, by dotted path (the nested
    sections themselves are not keys)."""
    out: dict[str, Key] = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = prefix + field.name
        default = (field.default_factory() if field.default is dataclasses.MISSING
                   else field.default)
        if dataclasses.is_dataclass(default):
            out.update(keys(type(default), name + "."))
            continue
        out[name] = Key(name, default, hints[field.name], field.metadata.get("help", ""),
                        field.metadata.get("rule"), choices(hints[field.name]))
    return out


def config_dict(cls: type) -> ml_collections.ConfigDict:
    """The defaults of section ``cls`` as a ConfigDict (nested sections as nested ConfigDicts,
    in declaration order)."""
    out = ml_collections.ConfigDict()
    for field in dataclasses.fields(cls):
        default = (field.default_factory() if field.default is dataclasses.MISSING
                   else field.default)
        out[field.name] = (config_dict(type(default)) if dataclasses.is_dataclass(default)
                           else default)
    return out


class Section:
    """Base of the section dataclasses: construction checks every key holding a Python value
    against its declaration (ConfigError naming the key, its value and what is allowed); other
    values (e.g. traced loss weights under ``jax.grad``) are the caller's."""

    SECTION = ""  # the section's dotted path in the config, for messages

    def __post_init__(self):
        for name, key in keys(type(self)).items():
            if "." in name:
                continue  # a nested section checks its own keys
            value, label = getattr(self, name), ".".join(filter(None, (self.SECTION, name)))
            if not isinstance(value, (bool, int, float, str)):
                continue
            if key.choices is not None and value not in key.choices:
                raise ConfigError(bad_choice(label, value, key.choices))
            if key.rule is not None and not key.rule.test(value):
                raise ConfigError(bad_value(label, value, key.rule.allowed))

    @classmethod
    def from_mapping(cls: type[T], values: Mapping[str, Any]) -> T:
        """``cls`` of ``values`` (nested sections from nested mappings); a key that is not a
        field of ``cls`` is a KeyError naming it. Only the typed config's builder
        (``trip_jax.config.typed``) and tests call it."""
        values = dict(values)
        declared = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(values) - set(declared)
        if unknown:
            raise KeyError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
        for name, value in values.items():
            section = declared[name].default_factory  # nested sections only have one
            if section is not dataclasses.MISSING and not isinstance(value, Section):
                values[name] = type(section()).from_mapping(value)
        return cls(**values)
