"""Packing rows into token sequences, and the few batch shapes packed_tokens compiles.

``pack_rows`` (first fit, longest first), ``row_keys`` / ``unique_rows`` (equal rows),
``Demands`` (sequences, rows, tracks of a batch slice), ``shape_classes`` (at most
``data.max_shapes`` classes per epoch) and ``track_index`` (a batch's real tracks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trip_jax.data.features import EncodedPair

# Cost of a shape class in encoder-token units: P per sequence, plus rough per-row (40 state
# heads) and per-track (a 6-layer detector over 7 sentences) costs, as a MiniLM-size step has
# them; only the choice of class boundaries depends on these.
ROW_COST = 0.5
TRACK_COST = 12.0


def pack_rows(lengths: np.ndarray, pack_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Packs rows of ``lengths`` tokens into sequences of ``pack_length`` tokens.

    First fit, longest row first (ties in row order): deterministic, and every sequence but the
    last opened is more than ``pack_length - longest row`` full. Returns (sequence of each row,
    token offset of each row in it, number of sequences). A row longer than ``pack_length`` is
    an error.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > pack_length:
        raise ValueError(f"a row has {lengths.max()} tokens but the pack length is {pack_length}; "
                         "raise data.pack_length or cut rows with data.max_length (with a report)")
    sequence = np.zeros(lengths.size, np.int32)
    offset = np.zeros(lengths.size, np.int32)
    free = np.zeros(lengths.size, np.int64)  # room left in each opened sequence
    opened = 0
    for row in np.argsort(-lengths, kind="stable"):
        fits = np.flatnonzero(free[:opened] >= lengths[row])
        if fits.size:
            target = fits[0]
        else:
            target, opened = opened, opened + 1
            free[target] = pack_length
        sequence[row] = target
        offset[row] = pack_length - free[target]
        free[target] -= lengths[row]
    return sequence, offset, opened


def row_keys(lengths: np.ndarray, tokens: np.ndarray, type_ids: np.ndarray) -> list[bytes]:
    """One key per row (its token ids and type ids): equal keys, equal encoder inputs."""
    ends = np.cumsum(lengths)
    return [tokens[end - n:end].tobytes() + type_ids[end - n:end].tobytes()
            for n, end in zip(lengths, ends)]


def unique_rows(keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first row of each distinct key, distinct-row number of every row)."""
    numbers: dict[bytes, int] = {}
    inverse = np.asarray([numbers.setdefault(k, len(numbers)) for k in keys], dtype=np.int64)
    # Numbers are given in order of first appearance, so np.unique's first indices line up.
    return np.unique(inverse, return_index=True)[1].astype(np.int64), inverse


def pair_demand(pair: EncodedPair, dedup_rows: bool = False) -> tuple[int, int, int]:
    """(real rows, real tokens, real tracks) of one pair: what it adds to a packed_tokens batch
    (``dedup_rows``: tokens of its distinct rows only)."""
    tracks = sum(s.num_entities for s in pair.stories if s.num_sentences)
    lengths = pair_row_lengths(pair, dedup_rows)
    return pair.num_rows, int(lengths.sum()), tracks


def pair_row_keys(pair: EncodedPair) -> list[bytes]:
    """``row_keys`` of every row of both stories of ``pair``, in row order."""
    return [key for s in pair.stories for key in row_keys(s.lengths, s.tokens, s.type_ids)]


def pair_row_lengths(pair: EncodedPair, dedup_rows: bool = False) -> np.ndarray:
    """Token lengths of the rows of ``pair`` (``dedup_rows``: of its distinct rows)."""
    lengths = np.concatenate([s.lengths for s in pair.stories])
    if dedup_rows:
        lengths = lengths[unique_rows(pair_row_keys(pair))[0]]
    return lengths


class Demands:
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


def shape_classes(demands: np.ndarray, max_shapes: int, pack_length: int) -> np.ndarray:
    """At most ``max_shapes`` (sequences, rows, tracks) classes covering every row of
    ``demands`` [n, 3], cheapest first.

    The demands are sorted and cut into contiguous groups, each class the componentwise largest
    demand of its group; the cut minimises the total cost of the batches (dynamic programming,
    ``class_cost``).
    """
    unique, counts = np.unique(np.asarray(demands, np.int64).reshape(-1, 3), axis=0,
                               return_counts=True)
    n, groups = len(unique), min(max_shapes, len(unique))
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


def track_index(row_mask: np.ndarray, num_tracks: int | None = None) -> np.ndarray:
    """Flat (B, 2, E) indices of the (story, entity) tracks that hold at least one real row.

    ``row_mask`` bool [B, 2, E, S]. Returns int32 [K], ascending, padded with B*2*E (one past
    the last track) up to ``num_tracks`` entries (default: exactly the real tracks); more real
    tracks than ``num_tracks`` is an error. The model's ``cells="real"`` runs the conflict
    detector on these tracks only.
    """
    row_mask = np.asarray(row_mask, bool)
    real = row_mask.reshape(-1, row_mask.shape[-1]).any(axis=-1)
    tracks = np.flatnonzero(real).astype(np.int32)
    num_tracks = tracks.size if num_tracks is None else num_tracks
    if tracks.size > num_tracks:
        raise ValueError(f"{tracks.size} real tracks do not fit {num_tracks} track entries")
    index = np.full(num_tracks, real.size, dtype=np.int32)
    index[:tracks.size] = tracks
    return index
