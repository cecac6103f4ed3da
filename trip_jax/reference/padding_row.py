"""The original's padding row (``model.tiered.padding_rows = "encoded"``), one model piece.

``PaddingRow.for_encoder`` (chosen by ``trip_jax.models.tiered.build_tiered_model``) adds the
padding row (token ids, mask and types 0) to the encoder's input as one more sequence, so the
encoder's one pass computes its vector too. Details: docs/fidelity.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.encoder_registry import family_of

# The additive bias of masked keys in transformers 4.x before 4.21 (the reference ran 4.11).
LEGACY_MASK_BIAS = -10000.0


def with_padding_row(inputs: Mapping[str, jax.Array | None], row_start: jax.Array, length: int,
                     pieces: int = 1) -> tuple[dict[str, jax.Array], jax.Array]:
    """The encoder inputs [N, L] (segment_ids None: the dense layout's rows become segment 1
    of their sequences) widened to ``length`` tokens, each of ``pieces`` equal pieces followed
    by a sequence of packed copies of the padding row (ids, types and mask 0; the encoders
    encode a fully masked packed row as alone): the inputs [N + pieces, max(L, length)] and
    ``row_start`` in them. Why: docs/fidelity.md."""
    segments = inputs["segment_ids"]
    if segments is None:
        segments = inputs["attention_mask"]
    num, width = inputs["input_ids"].shape
    wide, per = max(width, length), num // pieces

    def grow(x):
        x = jnp.asarray(x, jnp.int32).reshape(pieces, per, width)
        return jnp.pad(x, ((0, 0), (0, 1), (0, wide - width))).reshape(-1, wide)

    out = {key: grow(inputs[key]) for key in ("input_ids", "attention_mask", "token_type_ids")}
    out["segment_ids"] = grow(segments).reshape(pieces, per + 1, wide).at[:, per].set(
        jnp.arange(wide, dtype=jnp.int32) // length + 1).reshape(-1, wide)
    row_start = jnp.asarray(row_start, jnp.int32)
    sequence = row_start // width
    return out, (sequence + sequence // per) * wide + row_start % width


def mask_bias_for(encoder: nn.Module, attention: str) -> float | None:
    """The ``mask_bias`` that masks the padding row as ``attention`` says: "legacy"
    ``LEGACY_MASK_BIAS`` (encoders whose family takes ``mask_bias``:
    ``encoder_registry.Capabilities``; else ValueError), "masked" None (the encoder's own mask)."""
    if attention == "masked":
        return None
    if not family_of(encoder.config.model_type).capabilities.mask_bias:
        raise ValueError("padding_row_attention='legacy' reproduces transformers 4.11's "
                         "additive mask, which only some encoders take; use 'masked' for "
                         f"{type(encoder).__name__}")
    return LEGACY_MASK_BIAS


@dataclasses.dataclass(frozen=True)
class PaddingRow:
    """The padding row of ``length`` tokens, encoded with the encoder's keyword arguments
    ``mask_bias`` (None: the encoder's own masking)."""

    length: int
    mask_bias: float | None = None

    @classmethod
    def for_encoder(cls, encoder: nn.Module, length: int, attention: str) -> "PaddingRow":
        """The padding row of ``length`` tokens masked as ``attention`` ("legacy", "masked")
        says for ``encoder`` (``mask_bias_for``)."""
        return cls(length, mask_bias_for(encoder, attention))

    def add_to(self, inputs: Mapping[str, jax.Array | None], row_start: jax.Array,
               pieces: int = 1) -> tuple[dict[str, jax.Array], jax.Array, dict[str, float]]:
        """``with_padding_row`` and the encoder's keyword arguments for the widened inputs."""
        inputs, row_start = with_padding_row(inputs, row_start, self.length, pieces)
        extra = {} if self.mask_bias is None else {"mask_bias": self.mask_bias}
        return inputs, row_start, extra

    @staticmethod
    def vector(hidden: jax.Array) -> jax.Array:
        """The padding row's vector float32 [H] from the encoder's output on ``add_to``'s
        inputs: the first token of the last sequence."""
        return hidden[-1, 0].astype(jnp.float32)
