"""Relative-position buckets of the families that bias attention by distance (T5, MPNet).

``relative_position_buckets`` gives each (query, key) pair its bucket, ``RelativeAttentionBias``
the learned additive bias [1, heads, T, T]; within a packed row (a contiguous run) distances are
the row's own.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """int32 [length, length]: the bidirectional bucket of key k seen from query q (distance
    k - q), in float32 steps as Hugging Face's ``T5Attention._relative_position_bucket`` and
    ``MPNetEncoder.relative_position_bucket``."""
    distance = np.arange(length)[None, :] - np.arange(length)[:, None]
    half = num_buckets // 2
    buckets = (distance > 0).astype(np.int64) * half
    distance = np.abs(distance)
    exact = half // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (np.log(distance.astype(np.float32) / np.float32(exact))
                  / np.float32(math.log(max_distance / exact)) * np.float32(half - exact))
    large = np.minimum(exact + np.where(distance < exact, 0, scaled).astype(np.int64), half - 1)
    return (buckets + np.where(distance < exact, distance, large)).astype(np.int32)


class RelativeAttentionBias(nn.Module):
    """One learned table [rows, heads] (parameter ``embedding``, float32) looked up at the
    buckets of ``relative_position_buckets(T, num_buckets, max_distance)``: called with T, the
    additive attention bias [1, heads, T, T] in float32."""

    rows: int
    heads: int
    num_buckets: int
    max_distance: int
    init_std: float

    @nn.compact
    def __call__(self, length: int) -> jax.Array:
        table = self.param("embedding", nn.initializers.normal(self.init_std),
                           (self.rows, self.heads), jnp.float32)
        buckets = relative_position_buckets(length, self.num_buckets, self.max_distance)
        return jnp.moveaxis(table[buckets], -1, 0)[None]
