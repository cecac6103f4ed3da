"""Deterministic batching of encoded pairs into Batch dicts, for one or many processes.

The rule, exactly:
1. Epoch order: ``arange(n)``, or with ``shuffle`` the permutation drawn by
   ``np.random.default_rng([seed, epoch])``; the same (n, seed, epoch) always gives the same order.
2. Global batch g holds the pairs at order[g*batch_size : (g+1)*batch_size]. A last, partial
   global batch is padded at its end with empty pairs (pair_mask False, pair_index -1), or
   dropped with ``drop_remainder``. Every process yields the same number of batches,
   ``num_batches(n, batch_size, drop_remainder=...)``.
3. Process p of P builds the contiguous slice [p*L, (p+1)*L) of every global batch,
   L = batch_size / P (batch_size must be divisible by P). The slices of all processes are
   disjoint and, in process order, make up the global batch: this is the order in which
   ``jax.make_array_from_process_local_data`` assembles a batch sharded over devices.
4. Shapes are chosen from the whole global batch so that every process builds the same shapes:
   E = buckets.entities(largest story) unless ``num_entities`` fixes it (the reference's padding
   to the data's largest entity count: ``features.max_entities``), T = buckets.tokens(longest
   row) unless ``seq_len`` fixes it, packed R = buckets.rows(most real rows in any process's
   slice); dense R = L*2*E*S.
   With ``short_seq_len`` (packed only) rows of at most that many tokens form a second group of
   R_short = buckets.rows(most such rows in any slice) rows, and R counts the other rows the
   same way; a group that no slice needs has 0 rows.
``pair_index`` always holds indices into the full ``encoded_pairs`` list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from trip_jax.data.features import (DEFAULT_MAX_SENTENCES, LAYOUTS, Buckets, EncodedPair,
                                    build_batch)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One process's share of one global batch and the padded sizes of every process."""

    pair_index: np.ndarray  # int32 [batch_size / process_count]; -1 for padding pairs
    num_entities: int
    seq_len: int
    num_rows: int           # R of this layout (packed with short rows: the long rows)
    num_short_rows: int = 0  # rows of the short group (short_seq_len only)
    short_seq_len: int = 0   # T of the short group; 0: one group

    @property
    def shape_key(self) -> tuple[int, ...]:
        """The padded sizes that fix a step's compiled program (one compilation each)."""
        return (self.num_entities, self.num_rows, self.seq_len, self.num_short_rows,
                self.short_seq_len)


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


def plan_batches(encoded_pairs: Sequence[EncodedPair], batch_size: int, *,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0,
                 layout: str = "packed", drop_remainder: bool = False,
                 process_index: int = 0, process_count: int = 1,
                 buckets: Buckets = Buckets(), seq_len: int | None = None,
                 max_sentences: int = DEFAULT_MAX_SENTENCES,
                 short_seq_len: int | None = None,
                 num_entities: int | None = None) -> list[BatchPlan]:
    """Returns this process's plan of every batch of one epoch (module docstring: the rule).

    ``num_entities`` fixes E for every batch (a story with more entities is an error)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    short_seq_len = _check_short_seq_len(short_seq_len, layout, seq_len)
    local = process_slice(batch_size, process_index, process_count)
    width = batch_size // process_count
    order = epoch_order(len(encoded_pairs), shuffle=shuffle, seed=seed, epoch=epoch)
    entities = np.asarray([p.num_entities for p in encoded_pairs], dtype=np.int64)
    lengths = np.asarray([p.max_length for p in encoded_pairs], dtype=np.int64)
    rows = np.asarray([p.num_rows for p in encoded_pairs], dtype=np.int64)
    if short_seq_len:
        short_rows = np.asarray([sum(int((s.lengths <= short_seq_len).sum()) for s in p.stories)
                                 for p in encoded_pairs], dtype=np.int64)

    def group_rows(counts: np.ndarray, index: np.ndarray, optional: bool) -> int:
        real = np.where(index >= 0, counts[np.maximum(index, 0)], 0)
        most = int(real.reshape(process_count, width).sum(axis=1).max())
        return 0 if optional and most == 0 else buckets.rows(most)

    plans = []
    for g in range(num_batches(len(order), batch_size, drop_remainder=drop_remainder)):
        members = order[g * batch_size:(g + 1) * batch_size]
        index = np.full(batch_size, -1, dtype=np.int64)
        index[:members.size] = members
        largest = int(entities[members].max(initial=0))
        if num_entities is None:
            E = buckets.entities(largest)
        elif largest > num_entities:
            raise ValueError(f"a story has {largest} entities but num_entities is "
                             f"{num_entities}; pass the largest count of the data "
                             "(features.max_entities)")
        else:
            E = num_entities
        T = seq_len if seq_len is not None else buckets.tokens(int(lengths[members].max(initial=0)))
        R_short = 0
        if layout == "dense":
            R = width * 2 * E * max_sentences
        elif short_seq_len:
            R = group_rows(rows - short_rows, index, optional=True)
            R_short = group_rows(short_rows, index, optional=True)
        else:
            R = group_rows(rows, index, optional=False)
        plans.append(BatchPlan(index[local].astype(np.int32), E, T, R, R_short, short_seq_len))
    return plans


def batches(encoded_pairs: Sequence[EncodedPair], batch_size: int, *,
            shuffle: bool = False, seed: int = 0, epoch: int = 0,
            layout: str = "packed", drop_remainder: bool = False,
            process_index: int = 0, process_count: int = 1,
            buckets: Buckets = Buckets(), seq_len: int | None = None,
            max_sentences: int = DEFAULT_MAX_SENTENCES,
            short_seq_len: int | None = None,
            num_entities: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yields this process's Batch dicts for one epoch (module docstring: the exact rule).

    ``batch_size`` is the global batch in pairs; each dict holds batch_size / process_count
    pairs. ``seq_len`` fixes T for every batch (a longer row is an error, not a cut);
    ``short_seq_len`` adds the group of short rows (packed layout); ``num_entities`` fixes E.
    """
    pad_ids = {p.pad_id for p in encoded_pairs}
    if len(pad_ids) > 1:
        raise ValueError(f"encoded pairs come from tokenizers with different pad ids {pad_ids}")
    pad_id = pad_ids.pop() if pad_ids else 0
    plans = plan_batches(encoded_pairs, batch_size, shuffle=shuffle, seed=seed, epoch=epoch,
                         layout=layout, drop_remainder=drop_remainder,
                         process_index=process_index, process_count=process_count,
                         buckets=buckets, seq_len=seq_len, max_sentences=max_sentences,
                         short_seq_len=short_seq_len, num_entities=num_entities)
    for plan in plans:
        pairs = [encoded_pairs[i] if i >= 0 else None for i in plan.pair_index]
        yield build_batch(pairs, plan.pair_index, layout=layout,
                          num_entities=plan.num_entities, seq_len=plan.seq_len, pad_id=pad_id,
                          max_sentences=max_sentences,
                          num_rows=plan.num_rows if layout == "packed" else None,
                          short_seq_len=plan.short_seq_len or None,
                          num_short_rows=plan.num_short_rows)


def layout_stats(encoded_pairs: Sequence[EncodedPair], batch_size: int, *,
                 buckets: Buckets = Buckets(), seq_len: int | None = None,
                 max_sentences: int = DEFAULT_MAX_SENTENCES, shuffle: bool = False,
                 seed: int = 0, epoch: int = 0, short_seq_len: int | None = None,
                 num_entities: int | None = None) -> dict:
    """Real rows and tokens against the encoder rows and tokens of both layouts over one epoch
    (one process, no pair dropped), and the distinct compiled shapes.

    Keys: real_rows, real_tokens; per layout: {layout}_rows, {layout}_tokens,
    {layout}_real_fraction (rows), {layout}_token_fraction and {layout}_shapes (sorted distinct
    ``BatchPlan.shape_key`` values (E, R, T, R_short, T_short): one compilation each).
    ``short_seq_len`` applies to the packed layout.
    """
    real = sum(p.num_rows for p in encoded_pairs)
    real_tokens = sum(int(s.lengths.sum()) for p in encoded_pairs for s in p.stories)
    stats = {"real_rows": real, "real_tokens": real_tokens}
    for layout in LAYOUTS:
        plans = plan_batches(encoded_pairs, batch_size, layout=layout, buckets=buckets,
                             seq_len=seq_len, max_sentences=max_sentences, shuffle=shuffle,
                             seed=seed, epoch=epoch,
                             short_seq_len=short_seq_len if layout == "packed" else None,
                             num_entities=num_entities)
        total = sum(p.num_rows + p.num_short_rows for p in plans)
        tokens = sum(p.num_rows * p.seq_len + p.num_short_rows * p.short_seq_len for p in plans)
        stats[f"{layout}_rows"] = total
        stats[f"{layout}_tokens"] = tokens
        stats[f"{layout}_real_fraction"] = real / total if total else 0.0
        stats[f"{layout}_token_fraction"] = real_tokens / tokens if tokens else 0.0
        stats[f"{layout}_shapes"] = sorted({p.shape_key for p in plans})
    return stats


def _check_short_seq_len(short_seq_len: int | None, layout: str, seq_len: int | None) -> int:
    """Validates the short-row group's T; returns it (0: no short group)."""
    if not short_seq_len:
        return 0
    if layout != "packed":
        raise ValueError("short_seq_len splits the rows of the packed layout only")
    if short_seq_len < 1 or (seq_len is not None and short_seq_len >= seq_len):
        raise ValueError(f"short_seq_len must be between 1 and seq_len - 1 (seq_len={seq_len}), "
                         f"got {short_seq_len}")
    return int(short_seq_len)
