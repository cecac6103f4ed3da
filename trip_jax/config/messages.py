"""The one-line words of a mistake in a config or a name, shared by the schema and the CLI.

``ConfigError`` is a config the schema refuses (its message names the key); ``bad_value``,
``unknown_choice`` and ``closest`` write the lines, e.g.
``bad value for --config.train.batch_size: -3 (allowed: >= 1)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A config the schema refuses: one line naming the key, its value and what is allowed."""


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most similar to ``word`` (difflib), or None when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_choice(what: str, value: Any, choices: Iterable[Any]) -> str:
    """One line: ``unknown WHAT 'VALUE'; did you mean 'X'? (choices: ...)``."""
    choices = list(choices)
    suggestion = closest(str(value), [str(c) for c in choices])
    hint = f"; did you mean {suggestion!r}?" if suggestion is not None else ""
    return f"unknown {what} {value!r}{hint} (choices: {', '.join(repr(c) for c in choices)})"


def bad_value(key: str, value: Any, allowed: str) -> str:
    """One line: ``bad value for --config.KEY: VALUE (allowed: ...)``."""
    return f"bad value for --config.{key}: {value!r} (allowed: {allowed})"


def bad_choice(key: str, value: Any, choices: Iterable[Any]) -> str:
    """One line: ``config key KEY: unknown value 'VALUE'; did you mean ...? (choices: ...)``."""
    return f"config key {key}: " + unknown_choice("value", value, choices)
