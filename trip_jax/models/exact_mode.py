"""The model's exact-mode piece: the reference's padding-row vector (``padding_rows="encoded"``).

Every padding cell of the reference was an encoder row of ``padding_row_length`` token ids 0,
attention mask 0 and token types 0; ``padding_row_vector`` is that row's position-0 output,
computed once per call. Why and what it changes: docs/exact-mode.md, difference 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models.bert import BertEncoder

# The additive bias of masked keys in transformers 4.x before 4.21 (the reference ran 4.11).
LEGACY_MASK_BIAS = -10000.0


def padding_row_vector(encoder: nn.Module, length: int, attention: str,
                       deterministic: bool = True) -> jax.Array:
    """The encoder's position-0 output [H] (float32) on one all-zero, fully masked row.

    ``length`` tokens; ``attention`` "legacy" masks keys with ``LEGACY_MASK_BIAS`` (BERT and
    RoBERTa only, else ValueError), "masked" with the encoder's own mask. Call it inside the
    bound model that owns ``encoder``.
    """
    zeros = jnp.zeros((1, length), jnp.int32)
    extra = {}
    if attention == "legacy":
        if not isinstance(encoder, BertEncoder):
            raise ValueError("padding_row_attention='legacy' reproduces transformers 4.11's "
                             "additive mask of BERT/RoBERTa; use 'masked' for "
                             f"{type(encoder).__name__}")
        extra["mask_bias"] = LEGACY_MASK_BIAS
    hidden = encoder(zeros, zeros, token_type_ids=zeros, deterministic=deterministic, **extra)
    return hidden[0, 0, :].astype(jnp.float32)
