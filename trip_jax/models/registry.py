"""The registry of encoder families: the one list the rest of the package reads.

``UNITS`` names each unit of ``trip_jax/models/families/`` and the model types it serves, read
without importing a unit (the config's choices stay free of jax); ``families()`` imports them by
name, ``build_encoder`` builds one. Adding a family: docs/reference.md#adding-an-encoder-family.
"""

from __future__ import annotations

import functools
import importlib

from trip_jax.models.contract import Family, TokenizerStyle

# unit (trip_jax/models/families/<name>.py) -> the Hugging Face model types it serves.
UNITS: dict[str, tuple[str, ...]] = {
    "bert": ("bert",), "roberta": ("roberta",), "deberta": ("deberta", "deberta-v2"),
    "t5": ("t5",), "modernbert": ("modernbert",), "mpnet": ("mpnet",)}

# Every model_type served, in registry order.
MODEL_TYPES: tuple[str, ...] = tuple(t for types in UNITS.values() for t in types)


@functools.cache
def families() -> tuple[Family, ...]:
    """Every unit's ``FAMILY``, in ``UNITS`` order; ValueError naming a unit whose name or
    model types differ from its ``UNITS`` entry."""
    out = []
    for name, types in UNITS.items():
        family = importlib.import_module(f"trip_jax.models.families.{name}").FAMILY
        if (family.name, family.model_types) != (name, types):
            raise ValueError(f"trip_jax/models/families/{name}.py: FAMILY is "
                             f"{family.name!r} serving {family.model_types}; registry.UNITS "
                             f"says {name!r} serving {types}")
        out.append(family)
    return tuple(out)


@functools.cache
def tokenizer_styles() -> dict[str, TokenizerStyle]:
    """The families' tokenizer styles by name, in registry order (``word_level:<name>``)."""
    styles: dict[str, TokenizerStyle] = {}
    for family in families():
        styles.setdefault(family.tokenizer.name, family.tokenizer)
    return styles


def family_of(model_type: str | None) -> Family:
    """The family serving ``model_type``; ValueError naming it and the supported ones."""
    for family in families():
        if model_type in family.model_types:
            return family
    raise ValueError(f"unsupported encoder architecture model_type={model_type!r}; "
                     f"supported: {', '.join(MODEL_TYPES)}")


def build_encoder(hf_config, *, dtype=None, remat: bool = False, unroll: bool = False):
    """The Flax encoder module (``contract.Encoder``) of ``hf_config`` (a transformers config).

    ``dtype`` is the compute dtype (default float32; parameters stay float32); ``remat``
    rematerialises each layer in the backward pass; ``unroll`` unrolls the layers' scan.
    ValueError for a model_type no family serves, or an option its family lacks.
    """
    family = family_of(getattr(hf_config, "model_type", None))
    for option, wanted in (("remat", remat), ("unroll", unroll)):
        if wanted and not getattr(family.capabilities, option):
            raise ValueError(f"model.{option}: the {family.name} encoder does not support it")
    dtype = {} if dtype is None else {"dtype": dtype}  # None: the module's own, float32
    return family.build(hf_config, remat=remat, unroll=unroll, **dtype)
