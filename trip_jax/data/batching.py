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
   packed_tokens: E is fixed (``num_entities``, else the largest entity count of
   ``encoded_pairs``), T is the pack length P, and (N sequences, R rows, K tracks) is the
   smallest of at most ``max_shapes`` shape classes that fits every process's slice
   (``shape_classes``: chosen once from the batches of the first epochs, so every epoch uses the
   same few compiled shapes, with the largest class big enough for any batch).
``pair_index`` always holds indices into the full ``encoded_pairs`` list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from trip_jax.data.features import (DEFAULT_MAX_SENTENCES, LAYOUTS, Buckets, EncodedPair,
                                    build_batch, pack_rows, pair_demand, pair_row_keys,
                                    unique_rows)

# packed_tokens: pack length P when none is given, and the default number of shape classes.
DEFAULT_PACK_LENGTH = 64
DEFAULT_MAX_SHAPES = 4
# Epochs whose batches choose the shape classes when batches differ from epoch to epoch.
PROBE_EPOCHS = 4
# Cost of a shape class in encoder-token units: P per sequence, plus rough per-row (40 state
# heads) and per-track (a 6-layer detector over 7 sentences) costs, as a MiniLM-size step has
# them; only the choice of class boundaries depends on these.
ROW_COST = 0.5
TRACK_COST = 12.0


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One process's share of one global batch and the padded sizes of every process."""

    pair_index: np.ndarray  # int32 [batch_size / process_count]; -1 for padding pairs
    num_entities: int
    seq_len: int
    num_rows: int           # R of this layout (packed with short rows: the long rows)
    num_short_rows: int = 0  # rows of the short group (short_seq_len only)
    short_seq_len: int = 0   # T of the short group; 0: one group
    num_sequences: int = 0   # packed_tokens: N sequences of seq_len (= P) tokens
    num_tracks: int = 0      # packed_tokens: K (story, entity) tracks
    shards: int = 1          # packed_tokens: equal pieces the batch is built in (per device)

    @property
    def shape_key(self) -> tuple[int, ...]:
        """The padded sizes that fix a step's compiled program (one compilation each)."""
        return (self.num_entities, self.num_rows, self.seq_len, self.num_short_rows,
                self.short_seq_len, self.num_sequences, self.num_tracks)


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
                 num_entities: int | None = None,
                 max_shapes: int = DEFAULT_MAX_SHAPES,
                 dedup_rows: bool = False, shards_per_process: int = 1) -> list[BatchPlan]:
    """Returns this process's plan of every batch of one epoch (module docstring: the rule).

    ``num_entities`` fixes E for every batch (a story with more entities is an error).
    packed_tokens: ``seq_len`` is the pack length P and ``max_shapes`` bounds the shapes."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if layout == "packed_tokens":
        if short_seq_len:
            raise ValueError("short_seq_len splits the rows of the packed layout only")
        return _plan_packed_tokens(
            encoded_pairs, batch_size, shuffle=shuffle, seed=seed, epoch=epoch,
            drop_remainder=drop_remainder, process_index=process_index,
            process_count=process_count, pack_length=seq_len or DEFAULT_PACK_LENGTH,
            num_entities=num_entities, max_shapes=max_shapes, dedup_rows=dedup_rows,
            shards_per_process=shards_per_process)
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


def _batch_members(order: np.ndarray, batch_size: int, drop_remainder: bool) -> list[np.ndarray]:
    """Pair indices of every global batch of an epoch, -1 for padding pairs (rule 2)."""
    members = []
    for g in range(num_batches(len(order), batch_size, drop_remainder=drop_remainder)):
        chunk = order[g * batch_size:(g + 1) * batch_size]
        index = np.full(batch_size, -1, dtype=np.int64)
        index[:chunk.size] = chunk
        members.append(index)
    return members


class _Demands:
    """(sequences, rows, tracks) a packed_tokens batch slice needs, per pair set (memoised)."""

    def __init__(self, encoded_pairs: Sequence[EncodedPair], pack_length: int,
                 dedup_rows: bool = False):
        self.pack_length = pack_length
        self.dedup_rows = dedup_rows
        self.per_pair = np.asarray([pair_demand(p, dedup_rows) for p in encoded_pairs],
                                   dtype=np.int64).reshape(-1, 3)
        self.row_lengths = [np.concatenate([s.lengths for s in p.stories]) for p in encoded_pairs]
        self.row_keys = [pair_row_keys(p) for p in encoded_pairs] if dedup_rows else None
        self.cache: dict[tuple[int, ...], tuple[int, int, int]] = {}

    def of_slice(self, index: np.ndarray) -> tuple[int, int, int]:
        """Demand of the pairs ``index`` (-1 entries ignored)."""
        members = tuple(sorted(int(i) for i in index if i >= 0))
        if members not in self.cache:
            if not members:
                self.cache[members] = (0, 0, 0)
            else:
                lengths = np.concatenate([self.row_lengths[i] for i in members])
                if self.dedup_rows:  # rows shared by the pairs of the slice are packed once
                    keys = [key for i in members for key in self.row_keys[i]]
                    lengths = lengths[unique_rows(keys)[0]]
                rows, _, tracks = self.per_pair[list(members)].sum(axis=0)
                used = pack_rows(lengths, self.pack_length)[2]
                self.cache[members] = (used, int(rows), int(tracks))
        return self.cache[members]

    def of_batch(self, index: np.ndarray, shards: int) -> np.ndarray:
        """Componentwise largest demand of the ``shards`` slices of one global batch."""
        slices = index.reshape(shards, -1)
        return np.max([self.of_slice(s) for s in slices], axis=0)

    def worst(self, width: int) -> np.ndarray:
        """A demand no slice of ``width`` pairs can exceed (first fit leaves every sequence but
        the last more than P - longest row full)."""
        top = np.sort(self.per_pair, axis=0)[::-1][:width].sum(axis=0)
        longest = max((int(x.max()) for x in self.row_lengths if x.size), default=1)
        rows, tokens, tracks = (int(v) for v in top)
        sequences = min(rows, tokens // (self.pack_length - longest + 1) + 1)
        return np.asarray([sequences, rows, tracks], dtype=np.int64)


def class_cost(demand: np.ndarray, pack_length: int) -> np.ndarray:
    """Cost of shape classes ``demand`` [..., (sequences, rows, tracks)] in encoder tokens."""
    demand = np.asarray(demand, dtype=np.float64)
    return demand[..., 0] * pack_length + ROW_COST * demand[..., 1] + TRACK_COST * demand[..., 2]


def shape_classes(demands: np.ndarray, max_classes: int, pack_length: int) -> np.ndarray:
    """At most ``max_classes`` (sequences, rows, tracks) classes covering every row of
    ``demands`` [n, 3], cheapest first.

    The demands are sorted and cut into contiguous groups, each class the componentwise largest
    demand of its group; the cut minimises the total cost of the batches (dynamic programming,
    ``class_cost``).
    """
    unique, counts = np.unique(np.asarray(demands, np.int64).reshape(-1, 3), axis=0,
                               return_counts=True)
    n, groups = len(unique), min(max_classes, len(unique))
    if n == 0:
        return np.zeros((0, 3), np.int64)
    total = np.concatenate([[0], np.cumsum(counts)])
    best = np.full((groups + 1, n + 1), np.inf)
    best[0, 0] = 0.0
    start = np.zeros((groups + 1, n + 1), np.int64)
    for end in range(1, n + 1):
        caps = np.maximum.accumulate(unique[:end][::-1], axis=0)[::-1]  # caps[s]: max of s..end-1
        cost = (total[end] - total[:end]) * class_cost(caps, pack_length)
        for j in range(1, groups + 1):
            candidates = best[j - 1, :end] + cost
            start[j, end] = int(np.argmin(candidates))
            best[j, end] = candidates[start[j, end]]
    classes, end = [], n
    for j in range(groups, 0, -1):
        s = start[j, end]
        classes.append(unique[s:end].max(axis=0))
        end = s
        if end == 0:
            break
    classes = np.asarray(classes, np.int64).reshape(-1, 3)
    return classes[np.argsort(class_cost(classes, pack_length), kind="stable")]


def _plan_packed_tokens(encoded_pairs: Sequence[EncodedPair], batch_size: int, *, shuffle: bool,
                        seed: int, epoch: int, drop_remainder: bool, process_index: int,
                        process_count: int, pack_length: int, num_entities: int | None,
                        max_shapes: int, dedup_rows: bool, shards_per_process: int
                        ) -> list[BatchPlan]:
    """``plan_batches`` for the packed_tokens layout (module docstring, rule 4): every batch
    is built in ``shards_per_process`` pieces per process (one per device of the batch axis),
    and the shape classes size one piece."""
    if max_shapes < 1:
        raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
    local = process_slice(batch_size, process_index, process_count)
    shards = process_count * shards_per_process
    if batch_size % shards:
        raise ValueError(f"batch_size {batch_size} does not split over {shards} devices; use a "
                         f"multiple of {shards}")
    width = batch_size // shards
    largest = max((p.num_entities for p in encoded_pairs), default=1)
    if num_entities is not None and largest > num_entities:
        raise ValueError(f"a story has {largest} entities but num_entities is {num_entities}; "
                         "pass the largest count of the data (features.max_entities)")
    E = num_entities or largest
    demands = _Demands(encoded_pairs, pack_length, dedup_rows)
    # Every epoch has the same batches when they are single pairs or in a fixed order: the
    # first epoch shows them all. Otherwise the classes come from the first epochs, and one
    # class is kept for the largest batch possible.
    exhaustive = batch_size == 1 or not shuffle
    probe = [index for e in range(1 if exhaustive else PROBE_EPOCHS)
             for index in _batch_members(epoch_order(len(encoded_pairs), shuffle=shuffle,
                                                     seed=seed, epoch=e),
                                         batch_size, drop_remainder)]
    seen = np.asarray([demands.of_batch(i, shards) for i in probe]).reshape(-1, 3)
    if exhaustive:
        classes = shape_classes(seen, max_shapes, pack_length)
    else:
        classes = np.concatenate([shape_classes(seen, max_shapes - 1, pack_length),
                                  demands.worst(width)[None]])
    classes = np.maximum(classes, 1)  # never an empty dimension
    order = epoch_order(len(encoded_pairs), shuffle=shuffle, seed=seed, epoch=epoch)
    plans = []
    for index in _batch_members(order, batch_size, drop_remainder):
        need = demands.of_batch(index, shards)
        fits = np.flatnonzero((classes >= need).all(axis=1))
        if not fits.size:  # a batch unlike any probed one, beyond the largest class
            raise ValueError(f"a batch needs (sequences, rows, tracks) = {tuple(need)}, more "
                             f"than every shape class {classes.tolist()}")
        N, R, K = (int(v) * shards_per_process for v in classes[fits[0]])
        plans.append(BatchPlan(index[local].astype(np.int32), E, pack_length, R,
                               num_sequences=N, num_tracks=K, shards=shards_per_process))
    return plans


def batches(encoded_pairs: Sequence[EncodedPair], batch_size: int, *,
            shuffle: bool = False, seed: int = 0, epoch: int = 0,
            layout: str = "packed", drop_remainder: bool = False,
            process_index: int = 0, process_count: int = 1,
            buckets: Buckets = Buckets(), seq_len: int | None = None,
            max_sentences: int = DEFAULT_MAX_SENTENCES,
            short_seq_len: int | None = None,
            num_entities: int | None = None,
            max_shapes: int = DEFAULT_MAX_SHAPES,
            dedup_rows: bool = False,
            shards_per_process: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Yields this process's Batch dicts for one epoch (module docstring: the exact rule).

    ``batch_size`` is the global batch in pairs; each dict holds batch_size / process_count
    pairs. ``seq_len`` fixes T for every batch (a longer row is an error, not a cut; for
    packed_tokens it is the pack length P); ``short_seq_len`` adds the group of short rows
    (packed layout); ``num_entities`` fixes E; ``max_shapes`` bounds packed_tokens' shapes.
    """
    pad_ids = {p.pad_id for p in encoded_pairs}
    if len(pad_ids) > 1:
        raise ValueError(f"encoded pairs come from tokenizers with different pad ids {pad_ids}")
    pad_id = pad_ids.pop() if pad_ids else 0
    plans = plan_batches(encoded_pairs, batch_size, shuffle=shuffle, seed=seed, epoch=epoch,
                         layout=layout, drop_remainder=drop_remainder,
                         process_index=process_index, process_count=process_count,
                         buckets=buckets, seq_len=seq_len, max_sentences=max_sentences,
                         short_seq_len=short_seq_len, num_entities=num_entities,
                         max_shapes=max_shapes, dedup_rows=dedup_rows,
                         shards_per_process=shards_per_process)
    for plan in plans:
        pairs = [encoded_pairs[i] if i >= 0 else None for i in plan.pair_index]
        yield build_batch(pairs, plan.pair_index, layout=layout,
                          num_entities=plan.num_entities, seq_len=plan.seq_len, pad_id=pad_id,
                          max_sentences=max_sentences,
                          num_rows=plan.num_rows if layout != "dense" else None,
                          short_seq_len=plan.short_seq_len or None,
                          num_short_rows=plan.num_short_rows,
                          num_sequences=plan.num_sequences or None,
                          num_tracks=plan.num_tracks or None,
                          dedup_rows=dedup_rows and layout == "packed_tokens",
                          shards=plan.shards)


def layout_stats(encoded_pairs: Sequence[EncodedPair], batch_size: int, *,
                 buckets: Buckets = Buckets(), seq_len: int | None = None,
                 max_sentences: int = DEFAULT_MAX_SENTENCES, shuffle: bool = False,
                 seed: int = 0, epoch: int = 0, short_seq_len: int | None = None,
                 num_entities: int | None = None, pack_length: int = DEFAULT_PACK_LENGTH,
                 max_shapes: int = DEFAULT_MAX_SHAPES, dedup_rows: bool = False) -> dict:
    """Real rows and tokens against the encoder rows and tokens of every layout over one epoch
    (one process, no pair dropped), and the distinct compiled shapes.

    Keys: real_rows, real_tokens; per layout: {layout}_rows, {layout}_tokens,
    {layout}_real_fraction (rows), {layout}_token_fraction and {layout}_shapes (sorted distinct
    ``BatchPlan.shape_key`` values: one compilation each). ``short_seq_len`` applies to the
    packed layout, ``pack_length`` (P), ``max_shapes`` and ``dedup_rows`` to packed_tokens,
    whose encoder tokens are N x P per batch.
    """
    real = sum(p.num_rows for p in encoded_pairs)
    real_tokens = sum(int(s.lengths.sum()) for p in encoded_pairs for s in p.stories)
    stats = {"real_rows": real, "real_tokens": real_tokens}
    for layout in LAYOUTS:
        tokens_layout = layout == "packed_tokens"
        plans = plan_batches(encoded_pairs, batch_size, layout=layout, buckets=buckets,
                             seq_len=pack_length if tokens_layout else seq_len,
                             max_sentences=max_sentences, shuffle=shuffle, seed=seed, epoch=epoch,
                             short_seq_len=short_seq_len if layout == "packed" else None,
                             num_entities=num_entities, max_shapes=max_shapes,
                             dedup_rows=dedup_rows)
        total = sum(p.num_rows + p.num_short_rows for p in plans)
        tokens = sum((p.num_sequences if tokens_layout else p.num_rows) * p.seq_len
                     + p.num_short_rows * p.short_seq_len for p in plans)
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
