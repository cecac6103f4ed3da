"""Batch layouts: how encoded pairs become the encoder arrays of a batch (``data.layout``).

``from_config(config.data)`` builds the one layout object a run holds: ``PackedTokens``
("packed_tokens", the default) or ``Dense`` ("dense", the reference's); nothing outside this
package tests a layout's name. Details: docs/reference.md#encoder-input.
"""

from __future__ import annotations

from trip_jax.data.batch_contract import Field
from trip_jax.data.layouts.base import ENTITY_PADDINGS, Layout
from trip_jax.data.layouts.dense import Dense
from trip_jax.data.layouts.packed_tokens import PackedTokens

__all__ = ["ENTITY_PADDINGS", "LAYOUTS", "NAMES", "Dense", "Layout", "PackedTokens",
           "encoder_fields", "from_config"]

LAYOUTS: dict[str, type[Layout]] = {cls.name: cls for cls in (PackedTokens, Dense)}
NAMES: tuple[str, ...] = tuple(LAYOUTS)


def from_config(data_config) -> Layout:
    """The layout ``config.data`` describes (0 means "not set" for the optional lengths).

    Reads data.layout (checked by the typed config: ``sections.LayoutName``), max_sentences,
    max_length, token_types, entity_padding and the chosen layout's own keys.
    """
    return LAYOUTS[data_config.layout].from_config(
        data_config, max_sentences=data_config.max_sentences,
        max_length=data_config.max_length or None, token_types=data_config.token_types,
        entity_padding=data_config.entity_padding)


def encoder_fields() -> dict[str, tuple[Field, ...]]:
    """{layout name: its encoder arrays} (for ``batch_contract.describe``)."""
    return {name: cls.fields for name, cls in LAYOUTS.items()}
