"""What every layout does: encode pairs, plan an epoch's batches, build and check them.

A layout is a frozen dataclass built once from ``config.data``; a subclass declares its encoder
arrays (``fields``), plans each batch's padded sizes (``plan``) and builds a process's share in
per-device pieces (``build``), so ``input_pipeline.global_batch`` only moves index arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from trip_jax.data import batch_contract
from trip_jax.data.batch_contract import Field
from trip_jax.data import features
from trip_jax.data.batching import BatchPlan, Epoch
from trip_jax.data.features import EncodedPair
from trip_jax.data.types import StoryPair

# data.entity_padding -> whether E is the data's largest entity count (the reference's) rather
# than rounded per batch.
FIXES_ENTITIES: dict[str, bool] = {"bucket": False, "data_max": True}
ENTITY_PADDINGS: tuple[str, ...] = tuple(FIXES_ENTITIES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """How encoded pairs become batches (``config.data``; docs/reference.md, "Encoder input").

    max_sentences: S, the sentence slots of every story. max_length: rows longer than this are
    cut when encoding, with a report (None: never cut). token_types: "segments" (the tokenizer's
    type ids) or "zeros" (the reference's). entity_padding: "bucket" or "data_max" (every story
    padded to the data's largest entity count; ``for_splits`` fills it in). num_entities: the
    fixed E of every batch (None: chosen per batch by the layout).
    """

    # The value of data.layout that names this layout (shown in logs).
    name: ClassVar[str]
    # The batch contract's encoder arrays of this layout (with PAIR_FIELDS: a whole batch).
    fields: ClassVar[tuple[Field, ...]]
    # True: E is always the data's largest entity count (``for_splits``), whatever
    # entity_padding says.
    fixes_entities: ClassVar[bool]

    max_sentences: int
    max_length: int | None
    token_types: str
    entity_padding: str
    num_entities: int | None = None

    def encode(self, pairs: Sequence[StoryPair], tokenizer) -> list[EncodedPair]:
        """Tokenizes every (story, entity, sentence) row of ``pairs``
        (``features.encode_pairs``)."""
        return features.encode_pairs(pairs, tokenizer, max_sentences=self.max_sentences,
                                     max_length=self.max_length, token_types=self.token_types)

    def for_splits(self, splits) -> "Layout":
        """This layout with E fixed to the largest entity count of the protocol's three splits
        (``splits``: a ``trip_jax.data.protocol.ProtocolSplits``) when ``entity_padding`` is
        "data_max" or the layout ``fixes_entities`` (so training, selection and test, and every
        process, pad alike); unchanged otherwise."""
        if not (FIXES_ENTITIES[self.entity_padding] or self.fixes_entities):
            return self
        stories = [story for pairs in (splits.train, splits.selection, splits.test)
                   for pair in pairs for story in pair.stories]
        return dataclasses.replace(
            self, num_entities=max((story.num_entities for story in stories), default=1))

    def plan(self, encoded: Sequence[EncodedPair], epoch: Epoch) -> list[BatchPlan]:
        """This process's plan of every batch of ``epoch`` (``data.batching``, rules 1-4)."""
        raise NotImplementedError

    def build(self, pairs: Sequence[EncodedPair | None], plan: BatchPlan, pad_id: int
              ) -> dict[str, np.ndarray]:
        """The Batch dict of ``pairs`` (None: a padding pair) at the sizes of ``plan``."""
        raise NotImplementedError

    def max_row_tokens(self) -> tuple[str, int | None]:
        """(config key, value) of the most tokens a row may have (None: no fixed limit)."""
        raise NotImplementedError

    def encoder_load(self, plan: BatchPlan) -> tuple[int, int]:
        """(encoder rows, encoder tokens) of a batch of ``plan``."""
        raise NotImplementedError

    def length_text(self) -> str:
        """The token length of the encoder's sequences in words ("P=64", "T bucketed")."""
        raise NotImplementedError

    def _check(self, batch, sizes: dict[str, int]) -> None:
        """The layout's own checks of ``check`` (none by default)."""

    def check(self, batch) -> dict[str, int]:
        """``batch_contract.check_batch`` with this layout's fields and S, then its own checks;
        returns the named sizes. Raises BatchContractError."""
        sizes = batch_contract.check_batch(batch, self.fields, max_sentences=self.max_sentences)
        self._check(batch, sizes)
        return sizes

    def batches(self, encoded: Sequence[EncodedPair], epoch: Epoch
                ) -> Iterator[dict[str, np.ndarray]]:
        """This process's Batch dicts for ``epoch`` (each batch_size / process_count pairs)."""
        pad_ids = {p.pad_id for p in encoded}
        if len(pad_ids) > 1:
            raise ValueError(f"encoded pairs come from tokenizers with different pad ids {pad_ids}")
        pad_id = pad_ids.pop() if pad_ids else 0
        for plan in self.plan(encoded, epoch):
            pairs = [encoded[i] if i >= 0 else None for i in plan.pair_index]
            yield self.build(pairs, plan, pad_id)

    def stats(self, encoded: Sequence[EncodedPair], batch_size: int) -> dict:
        """Real rows and tokens against the encoder's over one unshuffled epoch (one process).

        Keys: real_rows, real_tokens, rows, tokens, real_fraction (rows), token_fraction (above
        1 where equal rows are encoded once) and shapes (the sorted distinct
        ``BatchPlan.shape_key``: one compilation each).
        """
        plans = self.plan(encoded, Epoch(batch_size))
        real = sum(p.num_rows for p in encoded)
        real_tokens = sum(int(s.lengths.sum()) for p in encoded for s in p.stories)
        rows, tokens = (int(v) for v in np.sum([self.encoder_load(p) for p in plans], axis=0)
                        ) if plans else (0, 0)
        return {"real_rows": real, "real_tokens": real_tokens, "rows": rows, "tokens": tokens,
                "real_fraction": real / rows if rows else 0.0,
                "token_fraction": real_tokens / tokens if tokens else 0.0,
                "shapes": sorted({p.shape_key for p in plans})}

    def summary(self, encoded: Sequence[EncodedPair], batch_size: int) -> str:
        """One line on how a split is laid out at ``batch_size`` (one unshuffled epoch): encoder
        tokens per real token (below 1 where equal rows are encoded once), the share of real
        rows, and the distinct shapes."""
        stats = self.stats(encoded, batch_size)
        per = stats["tokens"] / stats["real_tokens"] if stats["real_tokens"] else 0.0
        why = "; equal rows are encoded once" if per < 1 else ""
        return (f"{self.name} ({self.length_text()}), batch {batch_size}: "
                f"{stats['tokens']:,} encoder tokens for {stats['real_tokens']:,} real tokens "
                f"({per:.2f} per real token{why}), {100 * stats['real_fraction']:.0f}% "
                f"real rows, {len(stats['shapes'])} batch shapes")
