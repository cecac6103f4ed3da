"""The original's cells (``model.tiered.cells = "grid"``): the heads and the detector run on
every cell and track of the (B, 2, E, S) grid, so every cell draws its own dropout masks.

``GridCells`` has the methods of ``trip_jax.models.cells.RealCells``, the clean view, and is
chosen in its place by ``trip_jax.models.tiered.build_tiered_model``. Details: docs/fidelity.md.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np


def scatter_rows(row_values: jax.Array, row_index: jax.Array, row_shape: tuple[int, ...]
                 ) -> jax.Array:
    """Scatters per-encoder-row vectors [R, H] to a dense [*row_shape, H] grid.

    ``row_index`` holds flat indices into ``row_shape``; padding rows point one past the end and
    are dropped. Cells no row writes stay 0.
    """
    num_cells = int(np.prod(row_shape))
    dense = jnp.zeros((num_cells, row_values.shape[-1]), row_values.dtype)
    dense = dense.at[row_index].set(row_values, mode="drop")
    return dense.reshape(*row_shape, row_values.shape[-1])


class GridCells:
    """Every cell of the (B, 2, E, S) grid is an input (N = B*2*E*S); every track runs."""

    def __init__(self, row_mask: jax.Array, row_index: jax.Array):
        self.row_mask = row_mask
        self.row_index = row_index
        self.track_mask = row_mask.reshape(-1, row_mask.shape[-1])

    @classmethod
    def over(cls, batch: Mapping[str, jax.Array], row_index: jax.Array) -> "GridCells":
        """The view over ``batch["row_mask"]`` [B, 2, E, S]; ``row_index`` int32 [R]: the flat
        cell of each encoder row (B*2*E*S for a padding row)."""
        return cls(jnp.asarray(batch["row_mask"], bool), row_index)

    def gather(self, rows: jax.Array, padding: jax.Array | None) -> jax.Array:
        """[R, H] -> [B*2*E*S, H]: each row at its cell, padding cells set to ``padding``.

        Padding rows of the dense layout hold pad-token embeddings; they are replaced too.
        """
        h = scatter_rows(rows, self.row_index, self.row_mask.shape)
        if padding is None:
            h = h * self.row_mask[..., None]
        else:
            h = jnp.where(self.row_mask[..., None], h, padding)
        return h.reshape(-1, h.shape[-1])

    def tracks(self, values: jax.Array) -> jax.Array:
        """[B*2*E*S, ...] -> [B*2*E, S, ...]."""
        return values.reshape(-1, self.row_mask.shape[-1], *values.shape[1:])

    def to_grid(self, values: jax.Array) -> jax.Array:
        """[B*2*E*S, ...] -> [B, 2, E, S, ...]."""
        return values.reshape(*self.row_mask.shape, *values.shape[1:])

    def from_tracks(self, values: jax.Array) -> jax.Array:
        """[B*2*E, S] -> [B, 2, E, S]."""
        return values.reshape(self.row_mask.shape)
