"""The registry of encoder families: the one list the rest of the package reads.

Each entry is a unit of ``trip_jax/models/families/`` (``contract.Family``); adding a family is
adding its unit here (docs/reference.md#adding-an-encoder-family).
"""

from __future__ import annotations

from trip_jax.models.contract import Family, TokenizerStyle
from trip_jax.models.families import bert, deberta, modernbert, roberta, t5

FAMILIES: tuple[Family, ...] = (bert.FAMILY, roberta.FAMILY, deberta.FAMILY, t5.FAMILY,
                                 modernbert.FAMILY)

# Every model_type served, in registry order.
MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)


def _styles() -> dict[str, TokenizerStyle]:
    styles: dict[str, TokenizerStyle] = {}
    for family in FAMILIES:
        styles.setdefault(family.tokenizer.name, family.tokenizer)
    return styles


# Tokenizer styles by name, in registry order (``word_level:<name>``).
TOKENIZER_STYLES: dict[str, TokenizerStyle] = _styles()


def family_of(model_type: str | None) -> Family:
    """The family serving ``model_type``; ValueError naming it and the supported ones."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise ValueError(f"unsupported encoder architecture model_type={model_type!r}; "
                     f"supported: {', '.join(MODEL_TYPES)}")
