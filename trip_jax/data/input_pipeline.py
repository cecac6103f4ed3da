"""From data files to batches: protocol splits, tokenizer, encoding and batch streams.

Every path from TRIP files to the batch contract's arrays goes through here (training, evaluation,
prediction, benchmarks): ``prepare_data``, ``encode``, ``batch_stream`` (deterministic in seed and
epoch), ``global_batch`` and ``split_pairs``; the layout comes from ``layouts.from_config``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trip_jax.data import batch_contract, protocol
from trip_jax.runtime import paths, sharding
from trip_jax.data import batching, features, layouts, tokenizers
from trip_jax.data.features import EncodedPair
from trip_jax.data.layouts import Layout
from trip_jax.data.types import StoryPair


class UnknownSplitError(ValueError):
    """A split the protocol does not have, or one without pairs."""


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
    """Tokenizes every (story, entity, sentence) row of ``pairs`` (``Layout.encode``)."""
    return layout.encode(pairs, tokenizer)


def load_splits(data_config) -> protocol.ProtocolSplits:
    """The typed pairs of the protocol's train, selection and test splits (``config.data``)."""
    return protocol.load_protocol_splits(data_config)


def prepare_data(config) -> RunData:
    """Reads the protocol's splits, builds the tokenizer and encodes every pair."""
    splits = load_splits(config.data)
    for name, pairs in (("train", splits.train), ("selection", splits.selection),
                        ("test", splits.test)):
        if not pairs and not _empty_by_design(splits.protocol, name):
            raise ValueError(f"protocol {splits.protocol}: the {name} split is empty")
    everything = splits.train + splits.selection + splits.test
    tokenizer = tokenizers.build_tokenizer(config.model, features.vocabulary_texts(everything))
    layout = layouts.from_config(config.data).for_splits(splits)
    return RunData(splits, tokenizer, layout, encode(splits.train, tokenizer, layout),
                   encode(splits.selection, tokenizer, layout),
                   encode(splits.test, tokenizer, layout))


def _empty_by_design(protocol_name: str, split: str) -> bool:
    """Whether ``protocol_name`` leaves ``split`` empty: dev_cv never reads test, dev_all has no
    selection split."""
    return (protocol_name, split) in (("dev_cv", "test"), ("dev_all", "selection"))


def batch_stream(encoded: Sequence[EncodedPair], layout: Layout, batch_size: int, *,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0, shards: int = 1
                 ) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches of one epoch (global ``batch_size`` pairs each), in the order fixed
    by (seed, epoch); the last batch is padded with empty pairs. ``shards``: the batch pieces
    this process's devices hold (``sharding.local_batch_shards(mesh)``); the layout builds each
    piece's rows on their own, so a batch is the same however the devices are spread over
    processes."""
    return layout.batches(encoded, batching.Epoch(
        batch_size, shuffle=shuffle, seed=seed, epoch=epoch, process_index=jax.process_index(),
        process_count=jax.process_count(), shards_per_process=shards))


def packing_summary(encoded: Sequence[EncodedPair], layout: Layout, batch_size: int) -> str:
    """One line on how a split is laid out at ``batch_size`` (``Layout.summary``)."""
    return layout.summary(encoded, batch_size)


def num_batches(num_pairs: int, batch_size: int) -> int:
    """Batches per epoch (``batch_stream`` pads the last one)."""
    return batching.num_batches(num_pairs, batch_size)


def split_names(splits: protocol.ProtocolSplits) -> dict[str, list[StoryPair]]:
    """The splits of a protocol by name: "train", the selection split's name, "test"."""
    named = {"train": splits.train, splits.selection_name: splits.selection, "test": splits.test}
    return {name: pairs for name, pairs in named.items()
            if name and not _empty_by_design(splits.protocol, name)}


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
    return paths.data_file_hashes(sorted(set(splits.files.values())))


def rows_outside_their_piece(batch: Mapping[str, np.ndarray], pieces: int) -> int:
    """How many rows of ``batch`` (built in ``pieces`` equal pieces) start outside their own
    piece's sequences: the sharded steps read each piece's rows from its own (0 as built)."""
    starts = np.asarray(batch["row_start"])
    tokens = np.size(batch["input_ids"]) // pieces
    piece = np.arange(starts.size) // (starts.size // pieces)
    return int((starts // tokens != piece).sum())


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh
                 ) -> dict[str, jax.Array]:
    """Assembles each process's share of a batch into global arrays split over the mesh.

    ``local_batch`` holds this process's contiguous share of the global batch (B_local pairs and
    their encoder arrays, built by the layout in one piece per local device, so every leading
    dimension splits over them). Each index array of the contract
    (``batch_contract.INDEX_SPACES``: cells, tracks, tokens) is moved from the share's space to the global one; its padding entries
    point past the global end. With one process this is a sharded ``device_put``.
    """
    placement = sharding.batch_sharding(mesh)
    shards = sharding.num_batch_shards(mesh)
    local_shards = shards // jax.process_count()
    pairs = local_batch["pair_mask"].shape[0]
    if pairs % local_shards:
        raise ValueError(f"{pairs * jax.process_count()} pairs per batch do not split over "
                         f"{shards} devices; use a batch size divisible by {shards}")
    uneven = sorted(k for k, v in local_batch.items() if v.shape[0] % local_shards)
    if uneven:
        raise ValueError(f"{', '.join(uneven)} of this process's batch do not split over its "
                         f"{local_shards} devices; build the batch in that many pieces "
                         "(input_pipeline.batch_stream(shards=...))")
    if rows_outside_their_piece(local_batch, local_shards):
        raise ValueError("a row of this process's batch starts outside its device's piece of the "
                         f"sequences; build the batch in {local_shards} pieces "
                         "(input_pipeline.batch_stream(shards=...))")
    global_pairs = pairs * jax.process_count()
    first, last = sharding.local_block(placement, (global_pairs,))
    if last - first != pairs:
        raise ValueError(f"this process's devices hold pairs [{first}, {last}) of the global "
                         f"batch, but it built {pairs} pairs")
    cells = int(np.prod(local_batch["row_mask"].shape[1:]))  # 2 * E * S per pair
    sequences, length = local_batch["input_ids"].shape
    first_sequence = sharding.local_block(placement, (sequences * jax.process_count(),))[0]
    # (size of this share's space, where it starts in the global one, the global size)
    spaces = {"cells": (pairs * cells, first * cells, global_pairs * cells),
              "tracks": (pairs * (cells // local_batch["row_mask"].shape[-1]),
                         first * (cells // local_batch["row_mask"].shape[-1]),
                         global_pairs * (cells // local_batch["row_mask"].shape[-1])),
              "tokens": (sequences * length, first_sequence * length,
                         sequences * length * jax.process_count())}
    batch = dict(local_batch)
    for key, value in local_batch.items():
        if key in batch_contract.INDEX_SPACES:
            size, start, end = spaces[batch_contract.INDEX_SPACES[key]]
            index = value.astype(np.int64)
            batch[key] = np.where(index < size, index + start, end).astype(np.int32)
    result = {}
    for key, value in batch.items():
        global_shape = (value.shape[0] * jax.process_count(),) + value.shape[1:]
        result[key] = jax.make_array_from_process_local_data(placement, value, global_shape)
    return result
