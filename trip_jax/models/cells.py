"""Where the state heads and the detector run: the real rows and tracks plus one padding each.

``RealCells.over(batch, row_index)`` is the model's view of the grid; the model calls only
``gather``, ``tracks``, ``to_grid`` and ``from_tracks``. The original's view of every cell is
``trip_jax.reference.grid_cells.GridCells``. Details: docs/reference.md#model.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np


def scatter_over_padding(values: jax.Array, index: jax.Array, size: int) -> jax.Array:
    """Places ``values[:-1]`` at ``index`` in an array of ``size`` entries filled with
    ``values[-1]`` (the padding entry's value); indices outside 0..size-1 are dropped.

    ``values`` [N + 1, ...], ``index`` int [N]; returns [size, ...].
    """
    fill = jnp.broadcast_to(values[-1], (size, *values.shape[1:]))
    return fill.at[index].set(values[:-1], mode="drop")


def cells_to_tracks(cell_values: jax.Array, padding_value, track_index: jax.Array,
                    num_sentences: int) -> jax.Array:
    """Gathers the (story, entity) tracks ``track_index`` names and appends a padding track.

    ``cell_values`` [B*2*E*S, ...] per cell; returns [K + 1, S, ...]: the K tracks (an index
    past the last track gives the last track, for its result to be dropped), then S copies of
    ``padding_value``.
    """
    tracks = cell_values.reshape(-1, num_sentences, *cell_values.shape[1:])
    gathered = jnp.take(tracks, track_index, axis=0, mode="clip")
    padding = jnp.broadcast_to(jnp.asarray(padding_value, cell_values.dtype),
                               (1, num_sentences, *cell_values.shape[1:]))
    return jnp.concatenate([gathered, padding])


class RealCells:
    """The encoder rows on real cells plus one padding row are the inputs (N = R + 1); the
    tracks ``track_index`` names plus one all-padding track run (T = K + 1). Padding cells and
    tracks take the padding row's and track's results."""

    def __init__(self, row_mask: jax.Array, row_index: jax.Array, track_index: jax.Array):
        self.row_mask = row_mask
        self.row_index = row_index
        self.track_index = track_index
        self.num_cells = int(np.prod(row_mask.shape))
        self.track_mask = self._tracks_of(row_mask.reshape(-1), False)

    @classmethod
    def over(cls, batch: Mapping[str, jax.Array], row_index: jax.Array) -> "RealCells":
        """The view over ``batch["row_mask"]`` [B, 2, E, S]; ``row_index`` int32 [R]: the flat
        cell of each encoder row (B*2*E*S for a padding row). The tracks are those of
        ``batch["track_index"]`` (int32 [K]), every track where the batch has none."""
        row_mask = jnp.asarray(batch["row_mask"], bool)
        if "track_index" in batch:
            track_index = jnp.asarray(batch["track_index"], jnp.int32)
        else:
            track_index = jnp.arange(int(np.prod(row_mask.shape[:-1])), dtype=jnp.int32)
        return cls(row_mask, row_index, track_index)

    def _tracks_of(self, grid_values: jax.Array, padding_value) -> jax.Array:
        return cells_to_tracks(grid_values, padding_value, self.track_index,
                               self.row_mask.shape[-1])

    def _scatter(self, values: jax.Array) -> jax.Array:
        """[R + 1, ...] -> [B*2*E*S, ...]; cells no real row writes get ``values[-1]``."""
        return scatter_over_padding(values, self.row_index, self.num_cells)

    def gather(self, rows: jax.Array, padding: jax.Array | None) -> jax.Array:
        """[R, H] -> [R + 1, H]: rows off a real cell (padding rows of the dense layout too) set
        to ``padding``, then one row of ``padding``."""
        padding = (jnp.zeros((1, rows.shape[-1]), jnp.float32) if padding is None
                   else padding[None])
        num_cells = self.num_cells
        on_real_cell = (self.row_index < num_cells) & self.row_mask.reshape(-1)[
            jnp.minimum(self.row_index, num_cells - 1)]
        return jnp.concatenate([jnp.where(on_real_cell[:, None], rows, padding), padding])

    def tracks(self, values: jax.Array) -> jax.Array:
        """[R + 1, ...] -> [K + 1, S, ...]."""
        return self._tracks_of(self._scatter(values), values[-1])

    def to_grid(self, values: jax.Array) -> jax.Array:
        """[R + 1, ...] -> [B, 2, E, S, ...]."""
        return self._scatter(values).reshape(*self.row_mask.shape, *values.shape[1:])

    def from_tracks(self, values: jax.Array) -> jax.Array:
        """[K + 1, S] -> [B, 2, E, S]; tracks ``track_index`` does not name get ``values[-1]``."""
        num_tracks = self.num_cells // self.row_mask.shape[-1]
        return scatter_over_padding(values, self.track_index, num_tracks).reshape(
            self.row_mask.shape)
