"""Deterministic batching of encoded pairs into Batch dicts, for one or many processes.

The epoch order depends only on (seed, epoch); a last partial batch is padded with empty pairs
(or dropped); process p builds the contiguous p-th slice of every global batch, in one piece per
device. Details: docs/reference.md#hand-written-parts-and-why ("Batching").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Epoch:
    """Which batches of which epoch this process builds (rules 1-3).

    batch_size: the global batch in pairs; shuffle, seed, epoch: the order (rule 1);
    drop_remainder: drop a last, partial batch instead of padding it; process_index,
    process_count: this process's slice (rule 3); shards_per_process: the pieces (devices) the
    process's slice is built in.
    """

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    drop_remainder: bool = False
    process_index: int = 0
    process_count: int = 1
    shards_per_process: int = 1

    @property
    def local(self) -> slice:
        """The positions of a global batch this process builds."""
        return process_slice(self.batch_size, self.process_index, self.process_count)

    @property
    def shards(self) -> int:
        """Pieces of the global batch over all processes."""
        return self.process_count * self.shards_per_process

    def members(self, num_pairs: int) -> list[np.ndarray]:
        """Pair indices of every global batch of the epoch, -1 for padding pairs (rule 2)."""
        order = epoch_order(num_pairs, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        members = []
        for g in range(num_batches(num_pairs, self.batch_size,
                                   drop_remainder=self.drop_remainder)):
            chunk = order[g * self.batch_size:(g + 1) * self.batch_size]
            index = np.full(self.batch_size, -1, dtype=np.int64)
            index[:chunk.size] = chunk
            members.append(index)
        return members


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One process's share of one global batch and the padded sizes every process uses.

    pair_index: int32 [batch_size / process_count], -1 for padding pairs; num_entities: E;
    sizes: the layout's padded encoder sizes by contract dimension (e.g. {"T": 16}); shards:
    equal pieces (one per device) the share is built in.
    """

    pair_index: np.ndarray
    num_entities: int
    sizes: Mapping[str, int]
    shards: int = 1

    @property
    def shape_key(self) -> tuple:
        """The padded sizes that fix a step's compiled program (one compilation each)."""
        return (self.num_entities, *sorted(self.sizes.items()))


def num_batches(num_pairs: int, batch_size: int, *, drop_remainder: bool = False) -> int:
    """Number of batches per epoch (the same on every process)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return num_pairs // batch_size if drop_remainder else -(-num_pairs // batch_size)


def epoch_order(num_pairs: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """Order of the pairs in one epoch: identity, or a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(num_pairs)
    return np.random.default_rng([seed, epoch]).permutation(num_pairs)


def process_slice(batch_size: int, process_index: int, process_count: int) -> slice:
    """Positions of one global batch that process ``process_index`` builds (rule 3)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} out of range 0..{process_count - 1}")
    if batch_size % process_count:
        raise ValueError(f"batch_size {batch_size} is not divisible by the "
                         f"{process_count} processes")
    local = batch_size // process_count
    return slice(process_index * local, (process_index + 1) * local)
