"""The masks and positions of encoder rows, alone or packed several to a sequence.

``segment_ids`` (int [N, P]: 0 padding, k >= 1 the k-th row) drive the helpers the encoders use so
that every row is encoded as if alone: attention within a row (``attention_bias``), positions
restarting at its start (``position_ids``).
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


# The default bias of a masked key inside a packed row: it absorbs any attention logit, so that a
# fully masked row attends uniformly over its own tokens (as a fully masked row alone does under
# the float32 minimum), and it stays far above the float32 minimum that keeps other rows out.
ROW_MASK_BIAS = -1e30


def position_ids(config, input_ids: jax.Array, segment_ids: jax.Array | None = None, *,
                 offset: bool = False) -> jax.Array:
    """Returns absolute position ids [N, T]: 0.. (BERT); with ``offset`` (RoBERTa) counted from
    pad_id + 1, pads get pad_id.

    With ``segment_ids`` (packed rows) the count restarts at each row: the offset in the row,
    or pad_id + 1 + offset with ``offset`` (padding tokens, segment 0, get pad_id).
    """
    if segment_ids is not None:
        offsets = segment_positions(segment_ids)
        if offset:
            pad = config.pad_token_id
            return jnp.where(segment_ids > 0, offsets + pad + 1, pad)
        return offsets
    if offset:
        pad = config.pad_token_id
        not_pad = (input_ids != pad).astype(jnp.int32)
        return jnp.cumsum(not_pad, axis=1) * not_pad + pad
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def attention_bias(attention_mask: jax.Array, mask_bias: float | None = None,
                   segment_ids: jax.Array | None = None) -> jax.Array:
    """Additive float32 bias [N, 1, 1, T]: 0 where attended, ``mask_bias`` where masked.

    The default, the float32 minimum, is today's transformers' (a fully masked row attends
    uniformly); -10000.0 is transformers 4.11's (docs/fidelity.md, difference 1a).

    With ``segment_ids`` the bias is [N, 1, T, T]: a query sees only the keys of its own
    non-zero segment (``segments.segment_attention_mask``), those with ``attention_mask`` 0
    masked with ``mask_bias`` (default ``ROW_MASK_BIAS``), as the row alone would be; every
    other key, and every key of a padding token's query, gets the float32 minimum.
    """
    attended = attention_mask.astype(bool)[:, None, None, :]
    if segment_ids is None:
        masked = jnp.finfo(jnp.float32).min if mask_bias is None else mask_bias
        return jnp.where(attended, 0.0, masked).astype(jnp.float32)
    in_row = jnp.where(attended, 0.0, ROW_MASK_BIAS if mask_bias is None else mask_bias)
    return jnp.where(segment_attention_mask(segment_ids), in_row,
                     jnp.finfo(jnp.float32).min).astype(jnp.float32)
