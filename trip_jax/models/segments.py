"""Packed token sequences: several encoder rows concatenated into one sequence.

``segment_ids`` (int [N, P]: 0 padding, k >= 1 the k-th row) drive the helpers the encoders use so
that every row is encoded as if alone: attention within a row, positions restarting at its start.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """int32 [N, P]: each token's offset from the start of its run of equal segment ids.

    A run starts wherever the id differs from the previous token's; the offset is the token's
    index minus the index of the latest run start (a cumulative maximum along the sequence).
    Padding tokens after a row get offsets counted from the end of that row, so every offset
    stays below P.
    """
    index = jnp.arange(segment_ids.shape[-1], dtype=jnp.int32)
    first = jnp.ones(segment_ids.shape[:-1] + (1,), bool)
    starts = jnp.concatenate([first, segment_ids[..., 1:] != segment_ids[..., :-1]], axis=-1)
    run_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=segment_ids.ndim - 1)
    return index - run_start


def segment_attention_mask(segment_ids: jax.Array) -> jax.Array:
    """bool [N, 1, P, P]: query q may attend to key k iff both lie in the same non-zero segment.

    The query rows of padding tokens (segment 0) are all False; the encoders keep those rows
    finite (their softmax becomes uniform), and their outputs are never read.
    """
    query = segment_ids[:, None, :, None]
    key = segment_ids[:, None, None, :]
    return (query == key) & (query > 0)
