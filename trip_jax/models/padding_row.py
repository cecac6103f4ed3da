"""The exact-fidelity piece of the model: the reference's padding row (``padding_rows="encoded"``).

``with_padding_row`` adds the reference's padding row (token ids, mask and types 0) to the
encoder's input as one more sequence, so the encoder's one pass computes its vector too.
Details: docs/fidelity.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models.bert import BertEncoder

# The additive bias of masked keys in transformers 4.x before 4.21 (the reference ran 4.11).
LEGACY_MASK_BIAS = -10000.0


def with_padding_row(inputs: Mapping[str, jax.Array | None], row_start: jax.Array, length: int
                     ) -> tuple[dict[str, jax.Array], jax.Array]:
    """The encoder inputs [N, L] plus a last sequence holding the padding row, as packed rows.

    ``inputs``: input_ids, attention_mask, token_type_ids and segment_ids (None for the dense
    layout: each row becomes segment 1 of its sequence, its attended tokens). The sequences are
    widened to ``length`` tokens where shorter (padding tokens, segment 0); the last one holds
    token ids 0, types 0 and attention mask 0 in segments of ``length`` tokens (copies of the
    padding row, the last one cut; no token is a padding token, whose position could pass the
    encoder's table). The encoders encode a packed row as alone, a fully masked one too
    (``bert.attention_bias``, ``deberta.DebertaEncoder``), so the first copy's position-0
    output, the last sequence's first, is the padding-row vector. Returns the inputs
    [N + 1, max(L, length)] and ``row_start`` (flat n*L + l) in the widened sequences.
    """
    segments = inputs["segment_ids"]
    if segments is None:
        segments = inputs["attention_mask"]
    num, width = inputs["input_ids"].shape
    wide = max(width, length)
    grow = lambda x: jnp.pad(jnp.asarray(x, jnp.int32), ((0, 1), (0, wide - width)))
    out = {key: grow(inputs[key]) for key in ("input_ids", "attention_mask", "token_type_ids")}
    out["segment_ids"] = grow(segments).at[num].set(jnp.arange(wide, dtype=jnp.int32) // length
                                                    + 1)
    row_start = jnp.asarray(row_start, jnp.int32)
    return out, row_start // width * wide + row_start % width


def padding_row_masking(encoder: nn.Module, attention: str) -> dict[str, float]:
    """The encoder's keyword arguments that mask the padding row as ``attention`` says:
    "legacy" with ``LEGACY_MASK_BIAS`` (BERT and RoBERTa only, else ValueError), "masked" with
    the encoder's own mask (none)."""
    if attention == "masked":
        return {}
    if not isinstance(encoder, BertEncoder):
        raise ValueError("padding_row_attention='legacy' reproduces transformers 4.11's "
                         "additive mask of BERT/RoBERTa; use 'masked' for "
                         f"{type(encoder).__name__}")
    return {"mask_bias": LEGACY_MASK_BIAS}
