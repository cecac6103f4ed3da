"""The encoder families' contract and registry, free of jax: the config, the data and the models
read it. ``Family`` is what a unit of ``trip_jax/models/families/`` declares (``Encoder``: the call
its module answers); ``UNITS`` lists the units and their model types, ``families()`` imports them
by name, ``build_encoder`` builds one. Adding a family: docs/reference.md#adding-an-encoder-family.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # imports neither: the config reads the registry
    import jax
    import numpy as np

Path_ = tuple[str, ...]
Checkpoint = dict[Path_, "np.ndarray"]


class Encoder(Protocol):
    """The call every family's Flax module answers.

    ``input_ids``, ``attention_mask``, ``token_type_ids`` (None, or zeros where the family has
    none) and ``segment_ids`` (0 padding, k >= 1 the k-th packed row) are ints [N, T];
    ``extra`` is ``mask_bias`` where ``Capabilities.mask_bias``. Returns the last hidden states
    [N, T, H] in the compute dtype, each packed row as if encoded alone; the tiered model reads
    a row at its first token (``Family.pooled``).
    """

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None, deterministic: bool = True,
                 segment_ids: jax.Array | None = None, **extra: Any) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a family's encoder supports beyond the contract (which packed rows, remat and an
    unrolled layer scan are part of): the ``mask_bias`` keyword (transformers 4.11's additive
    mask, ``padding_row_attention='legacy'``), token types."""

    mask_bias: bool = False
    token_types: bool = True


@dataclasses.dataclass(frozen=True)
class LayerLayout:
    """Where the stacked layers live: the Flax module path of the stack (its parameters carry a
    leading layer axis) and, one entry per layer, Hugging Face's path (``{}`` the layer index).
    Both start at a parent module name, e.g. ``("encoder", "layer")`` and
    ``("encoder", "layer", "{}")``."""

    stacked: Path_
    per_layer: Path_


@dataclasses.dataclass(frozen=True)
class TokenizerStyle:
    """A family's tokenizer conventions, for the word-level tokenizers built here and to name a
    loaded tokenizer's style.

    ``special_tokens``: transformers' keyword -> token, in id order; ``cls`` / ``sep``: the
    tokens that open a sequence (None: none) and close each segment; ``single`` / ``pair``:
    the post-processor templates (``tokenizers.processors.TemplateProcessing``);
    ``token_types``: whether the model reads token type ids.
    """

    name: str
    special_tokens: Mapping[str, str]
    cls: str | None
    sep: str
    single: str
    pair: str
    token_types: bool

    def roles(self) -> tuple[str, ...]:
        """The pair template as roles: "cls", "sep", "x" (a run of text tokens)."""
        return collapse_roles(
            "cls" if piece == self.cls else "sep" if piece.split(":")[0] == self.sep else "x"
            for piece in self.pair.split())


def collapse_roles(roles: Iterable[str]) -> tuple[str, ...]:
    """``roles`` ("cls", "sep", "x" per token) with each run of "x" (text tokens) as one "x"."""
    out: list[str] = []
    for role in roles:
        if not (role == "x" and out and out[-1] == "x"):
            out.append(role)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Family:
    """One encoder family: everything the rest of the package knows about it.

    ``build(hf_config, dtype=, remat=, unroll=)`` (its module class) returns its Flax module
    (``Encoder``); ``model_types``: the Hugging Face ``model_type`` values it serves;
    ``layers``: its parameter layout; ``convert``: applied to a checkpoint ({path tuple: array},
    PyTorch names split at the dots) before renaming, or None; ``ignore_unexpected``: names of
    checkpoint tensors with no place in the model that are not an error; ``tokenizer``: its
    tokenizer style; ``position_offset``: absolute positions count from ``pad_token_id + 1``
    (RoBERTa); ``pooled``: the token whose hidden state stands for a row; ``random_config``:
    maps the ``model.random_encoder`` keys (Hugging Face BERT names) to the family's config
    keywords; ``published``: hub name -> the keys of its config.json that differ from the
    transformers class's defaults (``published_sizes``: what ``--mode=compile`` builds without
    the network); ``gated(hf_config)``: its feed-forward is gated (three h x i matrices, not
    two; the FLOP count of ``--mode=compile``).
    """

    name: str
    model_types: tuple[str, ...]
    build: Callable[..., Any]
    layers: LayerLayout
    tokenizer: TokenizerStyle
    capabilities: Capabilities = Capabilities()
    convert: Callable[[Checkpoint], Checkpoint] | None = None
    ignore_unexpected: tuple[str, ...] = ()
    position_offset: bool = False
    pooled: str = "the row's first token ([CLS] / <s>)"
    random_config: Callable[[dict], dict] | None = None
    published: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    gated: Callable[[Any], bool] = lambda hf_config: False


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
    """The Flax encoder module (``Encoder``) of ``hf_config`` (a transformers config):
    ``dtype`` the compute dtype (default float32; parameters stay float32), ``remat``
    rematerialises each layer in the backward pass, ``unroll`` unrolls the layers' scan.
    ValueError for a model_type no family serves."""
    family = family_of(getattr(hf_config, "model_type", None))
    dtype = {} if dtype is None else {"dtype": dtype}  # None: the module's own, float32
    return family.build(hf_config, remat=remat, unroll=unroll, **dtype)


def published_sizes() -> dict[str, dict[str, Any]]:
    """Every unit's published hub encoders: hub name -> config.json keys, ``model_type`` first
    (the unit's first model type)."""
    return {name: {"model_type": family.model_types[0], **sizes}
            for family in families() for name, sizes in family.published.items()}
