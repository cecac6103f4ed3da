"""From data files to batches: protocol splits, tokenizer, encoding and batch streams.

Everything that turns TRIP files into the batch contract's arrays (``trip_jax.batch_contract``)
goes through here, for training, evaluation, prediction and the benchmarks alike:

- ``Layout.from_config(config.data)``: how pairs are encoded and laid out (sentence slots, token
  lengths, packed or dense rows, shape buckets), one object passed around;
- ``prepare_data(config)``: the protocol's splits (``trip_jax.protocol``), the config's tokenizer
  and every pair encoded (``RunData``);
- ``encode(pairs, tokenizer, layout)``: typed pairs to unpadded token rows;
- ``batch_stream(encoded, layout, batch_size, ...)``: this process's batches of one epoch, in the
  deterministic order of ``trip_jax.data.batching`` (fixed by seed and epoch only, so a resumed
  run sees the same batches);
- ``split_pairs(splits, name)``: one split of a protocol by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trip_jax import builders, protocol, reports
from trip_jax.data import batching, features
from trip_jax.data.features import Buckets, EncodedPair
from trip_jax.data.types import StoryPair


# data.entity_padding: E rounded per batch, or the data's largest entity count (the reference's).
ENTITY_PADDINGS: tuple[str, ...] = ("bucket", "data_max")


class UnknownSplitError(ValueError):
    """A split the protocol does not have, or one without pairs."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """How encoded pairs become batches (``config.data``; docs/reference.md, "Encoder input").

    max_sentences: S, the sentence slots of every story.
    max_length: rows longer than this are cut when encoding, with a report (None: never cut).
    layout: "packed" (real rows only), "dense" (every cell a row, as the reference) or
      "packed_tokens" (real rows concatenated into sequences of ``pack_length`` tokens).
    seq_len: fixed T of every batch (None: bucketed per batch; packed and dense only).
    pack_length: P, the tokens of a packed sequence (packed_tokens).
    max_shapes: at most this many batch shapes per split and batch size (packed_tokens).
    dedup_rows: rows of a batch with equal tokens are encoded once (packed_tokens; equal
      results in evaluation, one shared encoder dropout draw in training).
    short_seq_len: rows of at most this many tokens form a second row group (None: one group).
    buckets: rounding of E, T and R to few shapes.
    token_types: "segments" (the tokenizer's type ids) or "zeros" (the reference's).
    entity_padding: "bucket" (E rounded per batch) or "data_max" (every story padded to the
      data's largest entity count, as the reference; ``for_splits`` fills in that count).
    num_entities: the fixed E of every batch (None: bucketed per batch; packed_tokens: the
      largest count of the pairs batched, or of the three splits after ``for_splits``).
    """

    max_sentences: int = features.DEFAULT_MAX_SENTENCES
    max_length: int | None = None
    layout: str = "packed"
    seq_len: int | None = None
    short_seq_len: int | None = None
    buckets: Buckets = Buckets()
    token_types: str = "segments"
    entity_padding: str = "bucket"
    num_entities: int | None = None
    pack_length: int = batching.DEFAULT_PACK_LENGTH
    max_shapes: int = batching.DEFAULT_MAX_SHAPES
    dedup_rows: bool = False

    def __post_init__(self):
        if self.layout not in features.LAYOUTS:
            raise ValueError(f"unknown data.layout {self.layout!r}; expected one of "
                             f"{features.LAYOUTS}")
        if self.layout == "packed_tokens" and (self.seq_len or self.short_seq_len):
            raise ValueError("data.seq_len and data.short_seq_len apply to the packed and dense "
                             "layouts; packed_tokens packs rows into data.pack_length tokens")
        if self.pack_length < 1 or self.max_shapes < 1:
            raise ValueError(f"data.pack_length ({self.pack_length}) and data.max_shapes "
                             f"({self.max_shapes}) must be >= 1")

    @classmethod
    def from_config(cls, data_config) -> "Layout":
        """The layout ``config.data`` describes (0 means "not set" for the optional lengths)."""
        return cls(max_sentences=data_config.max_sentences,
                   max_length=data_config.max_length or None,
                   layout=data_config.layout,
                   seq_len=data_config.seq_len or None,
                   short_seq_len=data_config.short_seq_len or None,
                   buckets=Buckets(**data_config.buckets),
                   token_types=data_config.token_types,
                   entity_padding=data_config.entity_padding,
                   pack_length=data_config.pack_length,
                   max_shapes=data_config.max_shapes,
                   dedup_rows=data_config.dedup_rows)

    def for_splits(self, splits: protocol.ProtocolSplits) -> "Layout":
        """This layout with E fixed to the largest entity count of the protocol's three splits
        when ``entity_padding`` is "data_max" or the layout is packed_tokens (so training,
        selection and test, and every process, pad alike); unchanged otherwise."""
        if self.entity_padding == "bucket" and self.layout != "packed_tokens":
            return self
        if self.entity_padding not in ENTITY_PADDINGS:
            raise ValueError(f"unknown data.entity_padding {self.entity_padding!r}; expected one "
                             f"of {ENTITY_PADDINGS}")
        stories = [story for pairs in (splits.train, splits.selection, splits.test)
                   for pair in pairs for story in pair.stories]
        return dataclasses.replace(
            self, num_entities=max((story.num_entities for story in stories), default=1))


@dataclasses.dataclass
class RunData:
    """The protocol's splits, the tokenizer and every split encoded."""

    splits: protocol.ProtocolSplits
    tokenizer: Any
    layout: Layout
    train: list[EncodedPair]
    selection: list[EncodedPair]
    test: list[EncodedPair]


def encode(pairs: Sequence[StoryPair], tokenizer, layout: Layout) -> list[EncodedPair]:
    """Tokenizes every (story, entity, sentence) row of ``pairs`` (``features.encode_pairs``)."""
    return features.encode_pairs(pairs, tokenizer, max_sentences=layout.max_sentences,
                                 max_length=layout.max_length, token_types=layout.token_types)


def load_splits(data_config) -> protocol.ProtocolSplits:
    """The typed pairs of the protocol's train, selection and test splits (``config.data``)."""
    return protocol.load_protocol_splits(data_config)


def prepare_data(config) -> RunData:
    """Reads the protocol's splits, builds the tokenizer and encodes every pair."""
    splits = load_splits(config.data)
    for name, pairs in (("train", splits.train), ("selection", splits.selection),
                        ("test", splits.test)):
        if not pairs:
            raise ValueError(f"protocol {splits.protocol}: the {name} split is empty")
    everything = splits.train + splits.selection + splits.test
    tokenizer = builders.build_tokenizer(config.model, features.vocabulary_texts(everything))
    layout = Layout.from_config(config.data).for_splits(splits)
    return RunData(splits, tokenizer, layout, encode(splits.train, tokenizer, layout),
                   encode(splits.selection, tokenizer, layout),
                   encode(splits.test, tokenizer, layout))


def batch_stream(encoded: Sequence[EncodedPair], layout: Layout, batch_size: int, *,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0, shards: int = 1
                 ) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches of one epoch (global ``batch_size`` pairs each), in the order fixed
    by (seed, epoch); the last batch is padded with empty pairs. ``shards``: the batch pieces
    this process's devices hold (``sharding.local_batch_shards(mesh)``); packed_tokens builds
    each piece on its own, so a device's rows sit in its own sequences and a batch is the same
    however the devices are spread over processes."""
    return batching.batches(
        encoded, batch_size, shuffle=shuffle, seed=seed, epoch=epoch, layout=layout.layout,
        process_index=jax.process_index(), process_count=jax.process_count(),
        buckets=layout.buckets, max_sentences=layout.max_sentences,
        seq_len=layout.pack_length if layout.layout == "packed_tokens" else layout.seq_len,
        short_seq_len=layout.short_seq_len, num_entities=layout.num_entities,
        max_shapes=layout.max_shapes, dedup_rows=layout.dedup_rows, shards_per_process=shards)


def packing_summary(encoded: Sequence[EncodedPair], layout: Layout, batch_size: int) -> str:
    """One line on how a split is laid out at ``batch_size`` (one unshuffled epoch): encoder
    tokens per batch shape, the share of them that are real, and the distinct shapes."""
    pack_length = layout.pack_length if layout.layout == "packed_tokens" else None
    stats = batching.layout_stats(
        encoded, batch_size, buckets=layout.buckets, seq_len=layout.seq_len,
        max_sentences=layout.max_sentences, short_seq_len=layout.short_seq_len,
        num_entities=layout.num_entities, pack_length=pack_length or batching.DEFAULT_PACK_LENGTH,
        max_shapes=layout.max_shapes, dedup_rows=layout.dedup_rows)
    name = layout.layout
    length = f"P={pack_length}" if pack_length else "T bucketed" if not layout.seq_len else (
        f"T={layout.seq_len}")
    token_share = 100 * stats[f"{name}_token_fraction"]
    return (f"{name} ({length}), batch {batch_size}: {stats['real_tokens']:,} real tokens in "
            f"{stats[f'{name}_tokens']:,} encoder tokens ({token_share:.0f}%), "
            f"{100 * stats[f'{name}_real_fraction']:.0f}% real rows, "
            f"{len(stats[f'{name}_shapes'])} batch shapes")


def num_batches(num_pairs: int, batch_size: int) -> int:
    """Batches per epoch (``batch_stream`` pads the last one)."""
    return batching.num_batches(num_pairs, batch_size)


def split_names(splits: protocol.ProtocolSplits) -> dict[str, list[StoryPair]]:
    """The splits of a protocol by name: "train", the selection split's name, "test"."""
    return {"train": splits.train, splits.selection_name: splits.selection, "test": splits.test}


def split_pairs(splits: protocol.ProtocolSplits, split: str) -> list[StoryPair]:
    """The pairs of ``split``; UnknownSplitError (listing the valid names) for an unknown one."""
    named = split_names(splits)
    if split not in named:
        raise UnknownSplitError(f"protocol {splits.protocol} has no split {split!r}; choose one "
                                f"of {', '.join(sorted(named))}")
    if not named[split]:
        raise UnknownSplitError(f"split {split!r} of protocol {splits.protocol} has no pairs")
    return named[split]


def data_files(splits: protocol.ProtocolSplits) -> Mapping[str, str]:
    """{path: sha256} of the data files the protocol read."""
    return reports.data_file_hashes(sorted(set(splits.files.values())))
