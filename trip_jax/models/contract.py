"""The encoder contract, written once: what the tiered model gives an encoder and gets back
(``Encoder``), and what a family, one unit of ``trip_jax/models/families/``, declares (``Family``).

The registry of families: ``trip_jax/models/registry.py``; adding one:
docs/reference.md#adding-an-encoder-family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the contract itself imports neither: the config reads the registry
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
    """What a family's encoder supports beyond the contract (which packed rows are part of):
    the ``mask_bias`` keyword (transformers 4.11's additive mask,
    ``padding_row_attention='legacy'``), rematerialised layers, an unrolled layer scan, token
    types."""

    mask_bias: bool = False
    remat: bool = True
    unroll: bool = True
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

    ``build(hf_config, dtype=, remat=, unroll=)`` returns its Flax module (``Encoder``);
    ``model_types``: the Hugging Face ``model_type`` values it serves; ``layers``: its parameter
    layout; ``convert``: applied to a checkpoint ({path tuple: array}, PyTorch names split at
    the dots) before renaming, or None; ``ignore_unexpected``: names of checkpoint tensors with
    no place in the model that are not an error; ``tokenizer``: its tokenizer style;
    ``position_offset``: absolute positions count from ``pad_token_id + 1`` (RoBERTa);
    ``pooled``: the token whose hidden state stands for a row; ``random_config``: maps the
    ``model.random_encoder`` keys (Hugging Face BERT names) to the family's config keywords.
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
