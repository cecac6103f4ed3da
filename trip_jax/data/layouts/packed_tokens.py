"""The packed_tokens layout (the default): real rows concatenated into sequences of P tokens.

Only real rows are encoded, each a segment of its sequence (``segment_ids``), equal rows once with
``data.dedup_rows``; E is fixed and (N, R, K) is one of at most ``data.max_shapes`` shape classes.
Each device's piece packs only its own pairs' rows. Details: docs/reference.md#encoder-input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from trip_jax.data.batch_contract import BatchContractError, Field
from trip_jax.data import features
from trip_jax.data.batching import BatchPlan, Epoch
from trip_jax.data.features import EncodedPair
from trip_jax.data.layouts import packing
from trip_jax.data.layouts.base import Layout

FIELDS: tuple[Field, ...] = (
    Field("input_ids", ("N", "P"), "int32", "packed sequences of row tokens; padding tokens "
          "hold the pad id"),
    Field("attention_mask", ("N", "P"), "int32", "1 on real tokens (segment_ids > 0)"),
    Field("token_type_ids", ("N", "P"), "int32", "each row's segment ids (0 entity, 1 sentence "
          "for BERT-style tokenizers; all 0 for tokenizers without them)"),
    Field("segment_ids", ("N", "P"), "int32", "k >= 1 on the tokens of the k-th row of the "
          "sequence, 0 on padding: tokens attend within their segment, positions restart there"),
    Field("row_start", ("R",), "int32", "flat index n*P + p of each row's first token (0 for "
          "padding rows)"),
    Field("row_index", ("R",), "int32", "flat index of the row's cell in the [B, 2, E, S] grid; "
          "B*2*E*S for a padding row"),
    Field("track_index", ("K",), "int32", "flat index into the [B, 2, E] tracks of each track "
          "with a real row, once (ascending within each device's piece of the batch); B*2*E "
          "for padding entries"),
)
# Epochs whose batches choose the shape classes when batches differ from epoch to epoch.
PROBE_EPOCHS = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackedTokens(Layout):
    """Rows packed into sequences (module docstring). pack_length: P, the tokens of a sequence;
    max_shapes: at most this many batch shapes per split and batch size; dedup_rows: rows of a
    batch with equal tokens are encoded once (equal results in evaluation, one shared encoder
    dropout draw in training)."""

    name: ClassVar[str] = "packed_tokens"
    fields: ClassVar[tuple[Field, ...]] = FIELDS
    fixes_entities: ClassVar[bool] = True

    pack_length: int
    max_shapes: int
    dedup_rows: bool

    def __post_init__(self):
        if self.pack_length < 1 or self.max_shapes < 1:
            raise ValueError(f"data.pack_length ({self.pack_length}) and data.max_shapes "
                             f"({self.max_shapes}) must be >= 1")

    @classmethod
    def from_config(cls, data_config, **common) -> "PackedTokens":
        """The packed_tokens layout of ``config.data`` (``common``: the keys every layout
        reads); ``data.seq_len`` must be 0 (the sequences have ``data.pack_length`` tokens)."""
        if data_config.seq_len:
            raise ValueError("data.seq_len applies to the dense layout; packed_tokens packs rows "
                             "into data.pack_length tokens")
        return cls(pack_length=data_config.pack_length, max_shapes=data_config.max_shapes,
                   dedup_rows=data_config.dedup_rows, **common)

    def plan(self, encoded: Sequence[EncodedPair], epoch: Epoch) -> list[BatchPlan]:
        """Every batch at the smallest shape class that fits each of its ``epoch.shards``
        pieces (module docstring); sizes N, R, K count the process's pieces together."""
        local, shards = epoch.local, epoch.shards
        if epoch.batch_size % shards:
            raise ValueError(f"batch_size {epoch.batch_size} does not split over {shards} "
                             f"devices; use a multiple of {shards}")
        width = epoch.batch_size // shards
        largest = max((p.num_entities for p in encoded), default=1)
        if self.num_entities is not None and largest > self.num_entities:
            raise ValueError(f"a story has {largest} entities but num_entities is "
                             f"{self.num_entities}; pass the largest count of the data "
                             "(features.max_entities)")
        E = self.num_entities or largest
        demands = packing.Demands(encoded, self.pack_length, self.dedup_rows)
        # Every epoch has the same batches when they are single pairs or in a fixed order: the
        # first epoch shows them all. Otherwise the classes come from the first epochs, and one
        # class is kept for the largest batch possible.
        exhaustive = epoch.batch_size == 1 or not epoch.shuffle
        probe = [index for e in range(1 if exhaustive else PROBE_EPOCHS)
                 for index in dataclasses.replace(epoch, epoch=e).members(len(encoded))]
        seen = np.asarray([demands.of_batch(i, shards) for i in probe]).reshape(-1, 3)
        if exhaustive:
            classes = packing.shape_classes(seen, self.max_shapes, self.pack_length)
        else:
            classes = np.concatenate([packing.shape_classes(seen, self.max_shapes - 1,
                                                            self.pack_length),
                                      demands.worst(width)[None]])
        classes = np.maximum(classes, 1)  # never an empty dimension
        plans = []
        for index in epoch.members(len(encoded)):
            need = demands.of_batch(index, shards)
            fits = np.flatnonzero((classes >= need).all(axis=1))
            if not fits.size:  # a batch unlike any probed one, beyond the largest class
                raise ValueError(f"a batch needs (sequences, rows, tracks) = {tuple(need)}, "
                                 f"more than every shape class {classes.tolist()}")
            N, R, K = (int(v) * epoch.shards_per_process for v in classes[fits[0]])
            plans.append(BatchPlan(index[local].astype(np.int32), E, {"N": N, "R": R, "K": K},
                                   shards=epoch.shards_per_process))
        return plans

    def build(self, pairs: Sequence[EncodedPair | None], plan: BatchPlan, pad_id: int
              ) -> dict[str, np.ndarray]:
        """The batch in ``plan.shards`` equal pieces of B / shards pairs, each packing its own
        pairs' rows into N / shards sequences (R / shards rows, K / shards tracks), then
        concatenated. A size missing from ``plan.sizes`` (one piece only) is exactly what the
        rows need. A row longer than P is an error."""
        shards, sizes = plan.shards, plan.sizes
        if shards == 1:
            return self._piece(pairs, plan.pair_index, plan.num_entities, sizes, pad_id)
        if set(sizes) != {"N", "R", "K"}:
            raise ValueError("a packed_tokens batch in shards needs N, R and K (every shard "
                             "the same size)")
        for name, size in {"pairs": len(pairs), **sizes}.items():
            if size % shards:
                raise ValueError(f"{name}={size} does not split into {shards} shards")
        per = len(pairs) // shards
        piece_sizes = {k: v // shards for k, v in sizes.items()}
        pieces = [self._piece(pairs[i * per:(i + 1) * per],
                              plan.pair_index[i * per:(i + 1) * per], plan.num_entities,
                              piece_sizes, pad_id) for i in range(shards)]
        cells = pieces[0]["row_mask"].size
        tracks = cells // self.max_sentences
        starts = pieces[0]["input_ids"].size
        batch = {key: np.concatenate([piece[key] for piece in pieces])
                 for key in pieces[0] if key not in ("row_start", "row_index", "track_index")}
        # Indices of each piece move by the pieces before it; padding entries point past the end.
        for key, step, end in (("row_start", starts, None), ("row_index", cells, shards * cells),
                               ("track_index", tracks, shards * tracks)):
            moved = []
            for i, piece in enumerate(pieces):
                value = piece[key].astype(np.int64)
                if end is None:
                    moved.append(value + i * step)
                else:
                    moved.append(np.where(value < step, value + i * step, end))
            batch[key] = np.concatenate(moved).astype(np.int32)
        return batch

    def _piece(self, pairs: Sequence[EncodedPair | None], pair_index: Sequence[int],
               num_entities: int, sizes, pad_id: int) -> dict[str, np.ndarray]:
        """One piece of a batch (``build``), packed on its own."""
        arrays, rows = features.grid(pairs, pair_index, num_entities=num_entities,
                                     max_sentences=self.max_sentences)
        batch = _packed_token_arrays(rows, self.pack_length, pad_id, sizes.get("N"),
                                     sizes.get("R"), arrays["row_mask"].size, self.dedup_rows)
        batch["track_index"] = packing.track_index(arrays["row_mask"], sizes.get("K"))
        return {**batch, **arrays}

    def max_row_tokens(self) -> tuple[str, int | None]:
        return "pack_length", self.pack_length

    def encoder_load(self, plan: BatchPlan) -> tuple[int, int]:
        return plan.sizes["R"], plan.sizes["N"] * self.pack_length

    def length_text(self) -> str:
        return f"P={self.pack_length}"

    def _check(self, batch, sizes: dict[str, int]) -> None:
        """Rows start on their own segment's first token, the attention mask is the segments'
        and ``track_index`` lists exactly the tracks with real rows."""
        segments = np.asarray(batch["segment_ids"]).reshape(-1)
        start = np.asarray(batch["row_start"])
        real = np.asarray(batch["row_index"]) < sizes["B"] * 2 * sizes["E"] * sizes["S"]
        first = start[real]
        if (segments[first] == 0).any() or ((first % sizes["P"] > 0)
                                            & (segments[first - 1] == segments[first])).any():
            raise BatchContractError("a row_start is not the first token of a segment")
        if not np.array_equal(np.asarray(batch["attention_mask"]).reshape(-1), segments > 0):
            raise BatchContractError("attention_mask differs from segment_ids > 0")
        row_mask = np.asarray(batch["row_mask"])
        num_tracks = row_mask.size // row_mask.shape[-1]
        tracks = np.asarray(batch["track_index"])
        expected = np.flatnonzero(row_mask.reshape(num_tracks, -1).any(axis=-1))
        listed = tracks[tracks != num_tracks]
        if not np.array_equal(np.sort(listed), expected):
            raise BatchContractError("track_index does not list each track with real rows "
                                     "exactly once (other entries: B*2*E)")


def _packed_token_arrays(rows: features.Rows, pack_length: int, pad_id: int,
                         num_sequences: int | None, num_rows: int | None, slots: int,
                         dedup_rows: bool) -> dict[str, np.ndarray]:
    """Encoder arrays of the real ``rows`` of one piece (module docstring);
    with ``dedup_rows`` rows of equal tokens are packed once and share one ``row_start``."""
    n = rows.lengths.size
    if dedup_rows:
        first, inverse = packing.unique_rows(packing.row_keys(rows.lengths, rows.tokens,
                                                              rows.type_ids))
    else:
        first, inverse = np.arange(n), np.arange(n)
    lengths = rows.lengths[first]
    sequence, offset, used = packing.pack_rows(lengths, pack_length)
    N = used if num_sequences is None else num_sequences
    R = n if num_rows is None else num_rows
    if used > N or n > R:
        raise ValueError(f"{n} real rows packed into {used} sequences do not fit {R} rows in "
                         f"{N} sequences")
    input_ids = np.full(N * pack_length, pad_id, dtype=np.int32)
    token_type_ids = np.zeros(N * pack_length, dtype=np.int32)
    segment_ids = np.zeros(N * pack_length, dtype=np.int32)
    starts = (sequence * pack_length + offset).astype(np.int32)  # of the packed rows
    row_start = np.zeros(R, dtype=np.int32)
    row_start[:n] = starts[inverse]
    if first.size:
        # Segment k of a sequence is the k-th row placed in it (rows are placed left to right).
        u = first.size
        order = np.lexsort((offset, sequence))
        segment = np.empty(u, np.int32)
        firsts = np.r_[True, sequence[order][1:] != sequence[order][:-1]]
        counter = np.arange(u) - np.maximum.accumulate(np.where(firsts, np.arange(u), 0))
        segment[order] = counter + 1
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        source = np.repeat((np.cumsum(rows.lengths) - rows.lengths)[first], lengths) + within
        target = np.repeat(starts, lengths) + within
        input_ids[target] = rows.tokens[source]
        token_type_ids[target] = rows.type_ids[source]
        segment_ids[target] = np.repeat(segment, lengths)
    row_index = np.full(R, slots, dtype=np.int32)
    row_index[:n] = rows.positions
    shape = (N, pack_length)
    return {"input_ids": input_ids.reshape(shape),
            "attention_mask": (segment_ids > 0).astype(np.int32).reshape(shape),
            "token_type_ids": token_type_ids.reshape(shape),
            "segment_ids": segment_ids.reshape(shape),
            "row_start": row_start, "row_index": row_index}
