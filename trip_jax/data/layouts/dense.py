"""The dense layout (the reference's): every cell of the [B, 2, E, S] grid is an encoder row.

R = B*2*E*S rows of T tokens in grid order; E and T are bucketed per batch unless
``data.entity_padding = "data_max"`` or ``data.seq_len`` fixes them (a longer row is then an
error, not a cut). Details: docs/reference.md#encoder-input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from trip_jax.data.batch_contract import BatchContractError, Field
from trip_jax.data import features
from trip_jax.data.batching import BatchPlan, Epoch
from trip_jax.data.features import Buckets, EncodedPair
from trip_jax.data.layouts.base import Layout

FIELDS: tuple[Field, ...] = (
    Field("input_ids", ("R", "T"), "int32", "token ids of each cell's row, in grid order: the "
          "entity, then the sentence (tokenizer sentence-pair encoding); padding tokens hold "
          "the pad id"),
    Field("attention_mask", ("R", "T"), "int32", "1 on real tokens; padding rows attend to "
          "their first token only, so that no row is fully masked"),
    Field("token_type_ids", ("R", "T"), "int32", "segment ids (0 entity, 1 sentence for "
          "BERT-style tokenizers; all 0 for tokenizers without them)"),
    Field("row_start", ("R",), "int32", "r*T: each row is its own sequence, read at its first "
          "token"),
    Field("row_index", ("R",), "int32", "flat index of the row's cell in the [B, 2, E, S] "
          "grid: arange(R), every cell is a row"),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dense(Layout):
    """Every cell a row (module docstring). seq_len: the fixed T of every batch (None: bucketed
    per batch); buckets: the rounding of E and T (``data.buckets``)."""

    name: ClassVar[str] = "dense"
    fields: ClassVar[tuple[Field, ...]] = FIELDS
    fixes_entities: ClassVar[bool] = False

    seq_len: int | None
    buckets: Buckets

    @classmethod
    def from_config(cls, data_config, **common) -> "Dense":
        """The dense layout of ``config.data`` (``common``: the keys every layout reads)."""
        buckets = data_config.buckets
        return cls(seq_len=data_config.seq_len or None,
                   buckets=Buckets(entity_min=buckets.entity_min,
                                   entity_step=buckets.entity_step,
                                   token_multiple=buckets.token_multiple), **common)

    def plan(self, encoded: Sequence[EncodedPair], epoch: Epoch) -> list[BatchPlan]:
        """E and T from the whole global batch (module docstring), R = width*2*E*S."""
        local = epoch.local
        entities = np.asarray([p.num_entities for p in encoded], dtype=np.int64)
        lengths = np.asarray([p.max_length for p in encoded], dtype=np.int64)
        plans = []
        for index in epoch.members(len(encoded)):
            members = index[index >= 0]
            largest = int(entities[members].max(initial=0))
            if self.num_entities is None:
                E = self.buckets.entities(largest)
            elif largest > self.num_entities:
                raise ValueError(f"a story has {largest} entities but num_entities is "
                                 f"{self.num_entities}; pass the largest count of the data "
                                 "(features.max_entities)")
            else:
                E = self.num_entities
            T = self.seq_len or self.buckets.tokens(int(lengths[members].max(initial=0)))
            plans.append(BatchPlan(index[local].astype(np.int32), E, {"T": T}))
        return plans

    def build(self, pairs: Sequence[EncodedPair | None], plan: BatchPlan, pad_id: int
              ) -> dict[str, np.ndarray]:
        """Every cell a row of T = plan.sizes["T"] tokens, in grid order: a device's pairs are
        a contiguous block of rows, so the share needs no building in pieces."""
        arrays, rows = features.grid(pairs, plan.pair_index, num_entities=plan.num_entities,
                                     max_sentences=self.max_sentences)
        T, cells = plan.sizes["T"], arrays["row_mask"].size
        if rows.lengths.size and rows.lengths.max() > T:
            raise ValueError(f"a row has {rows.lengths.max()} tokens but seq_len is {T}; pick a "
                             "larger seq_len or encode with max_length to truncate (with a "
                             "report)")
        input_ids = np.full((cells, T), pad_id, dtype=np.int32)
        attention_mask = np.zeros((cells, T), dtype=np.int32)
        token_type_ids = np.zeros((cells, T), dtype=np.int32)
        lengths = rows.lengths
        if lengths.size:
            # Scatter the ragged rows in one go: token t of row i goes to (its cell, t).
            within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths,
                                                               lengths)
            target = np.repeat(rows.positions, lengths)
            input_ids[target, within] = rows.tokens
            attention_mask[target, within] = 1
            token_type_ids[target, within] = rows.type_ids
        # Padding rows attend to their first (pad) token so that no row is fully masked.
        attention_mask[:, 0] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "token_type_ids": token_type_ids,
                "row_start": (np.arange(cells) * T).astype(np.int32),
                "row_index": np.arange(cells, dtype=np.int32), **arrays}

    def max_row_tokens(self) -> tuple[str, int | None]:
        return "seq_len", self.seq_len

    def encoder_load(self, plan: BatchPlan) -> tuple[int, int]:
        rows = len(plan.pair_index) * 2 * plan.num_entities * self.max_sentences
        return rows, rows * plan.sizes["T"]

    def length_text(self) -> str:
        return f"T={self.seq_len}" if self.seq_len else "T bucketed"

    def _check(self, batch, sizes: dict[str, int]) -> None:
        """R == B*2*E*S and row_start == arange(R) * T."""
        cells = sizes["B"] * 2 * sizes["E"] * sizes["S"]
        if sizes["R"] != cells or not np.array_equal(np.asarray(batch["row_start"]),
                                                     np.arange(cells) * sizes["T"]):
            raise BatchContractError(f"a dense batch has B*2*E*S={cells} rows starting at r*T, got "
                                 f"R={sizes['R']}")

