"""The checks of a whole config that no single section makes, read off the schema.

``check_keys(values)`` names the first key the schema lacks or a config lacks; ``check_rules``
the first breaking a ``CROSS_RULES`` rule between keys (one-line ``messages.ConfigError``).
Each key's own values are checked by its section (``fields.Section``). Details: docs/reference.md#allowed-values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trip_jax.config import sweeps
from trip_jax.config.messages import ConfigError, bad_value, closest
from trip_jax.config.sections import KEYS

# A rule between keys: returns (the key to change, what it allows) when ``values`` (every key by
# dotted path) breaks it, else None.
CrossRule = Callable[[Mapping[str, Any]], tuple[str, str] | None]


def _seq_len(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values["data.seq_len"] and values["data.layout"] == "packed_tokens":
        return "data.seq_len", "0 with data.layout 'packed_tokens' (it packs data.pack_length)"
    return None


def _detector_heads(values: Mapping[str, Any]) -> tuple[str, str] | None:
    width = values["model.tiered.embedding_projection"] + values["model.tiered.state_projection"]
    if width % values["model.tiered.detector_heads"]:
        return ("model.tiered.detector_heads", f"a divisor of the detector width {width} "
                "(embedding_projection + state_projection)")
    return None


def _random_encoder(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values["model.encoder"]:
        return None  # a pretrained encoder: random_encoder is not used
    if not values["model.tokenizer"]:
        return ("model.tokenizer", "a tokenizer (e.g. 'word_level:bert') when model.encoder is "
                "empty (a random encoder)")
    width = values["model.random_encoder.hidden_size"]
    if width % values["model.random_encoder.num_attention_heads"]:
        return ("model.random_encoder.num_attention_heads",
                f"a divisor of model.random_encoder.hidden_size ({width})")
    return None


def _mesh_axes(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values["mesh.data"] == -1 and values["mesh.fsdp"] == -1:
        return "mesh.fsdp", "not -1 when mesh.data is -1 (one axis takes what the other leaves)"
    return None


def _cv_sweep(values: Mapping[str, Any]) -> tuple[str, str] | None:
    try:
        sweeps.parse(values["cv.sweep"])
    except ValueError as err:
        return "cv.sweep", str(err)
    return None


CROSS_RULES: tuple[CrossRule, ...] = (
    _seq_len, _detector_heads, _random_encoder, _mesh_axes, _cv_sweep)


def check_keys(values: Mapping[str, Any]) -> None:
    """ConfigError for the first key of the schema that ``values`` (every key by dotted path)
    lacks, or the first of its keys the schema lacks."""
    for key in KEYS:
        if key not in values:
            raise ConfigError(f"the config has no key {key} (configs/base.py builds every "
                              "key of trip_jax/config/sections.py)")
    for key in values:
        if key not in KEYS:
            hint = closest(key, KEYS)
            raise ConfigError(f"unknown config key {key}"
                              + (f"; did you mean {hint}?" if hint else "")
                              + " (not in trip_jax/config/sections.py)")


def check_rules(values: Mapping[str, Any]) -> None:
    """ConfigError for the first key of ``values`` (every key by dotted path) that breaks a
    ``CROSS_RULES`` rule."""
    for cross_rule in CROSS_RULES:
        broken = cross_rule(values)
        if broken is not None:
            key, allowed = broken
            raise ConfigError(bad_value(key, values[key], allowed))
