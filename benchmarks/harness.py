"""The real training objects of one model, built the way ``trip_jax.train`` builds them.

``Harness.build`` reads the dev pairs from ``$TRIP_DATA_DIR``, tokenizes them with the model's
tokenizer (``trip_jax.input_pipeline``), and creates the mesh, the model and, with
``train.build_trainer`` (as training does), the optimizer, the train state and the jitted train
and eval steps. The benchmarks time exactly those step functions (encoder + heads + detector +
loss + optimizer update).

Also here: the batches the benchmarks feed them. ``representative_pairs`` picks B pairs spread
over the dev set's row-count distribution (so a fixed batch has about the mean pair size), and
``LAYOUTS`` names every layout the trip-jax cases time: the config overrides it needs and the
function that builds its batch. ``packed`` is the training layout; ``reference_dense`` lays one
pair out as the reference did (padded to the data's largest entity count, sentence count and
row length, one pair a batch). A new layout is one more ``LAYOUTS`` entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import ml_collections
import numpy as np

from benchmarks import models
from trip_jax import builders, input_pipeline, protocol, sharding
from trip_jax.data import features, layouts, readers
from trip_jax.data.batching import BatchPlan
from trip_jax.data.features import EncodedPair
from trip_jax.data.layouts import Layout
from trip_jax.data.types import StoryPair
from trip_jax.models.tiered import TieredConfig

if TYPE_CHECKING:  # imported where a Harness is built: ModelData alone does not need it
    from trip_jax import train

# The pair sets a harness can load.
SPLITS = ("dev", "dev_train")
# Steps the optimizer schedule is built for (the constant schedule ignores it).
_SCHEDULE_STEPS = 10_000


@dataclasses.dataclass
class ModelData:
    """One model's run configuration and the dev pairs, raw and tokenized with its tokenizer."""

    name: str
    config: ml_collections.ConfigDict
    tokenizer: Any
    pairs: list[StoryPair]
    encoded: list[EncodedPair]
    # E of every batch where training fixes it (``Layout.for_splits``: data_max entity padding
    # or packed_tokens): the largest entity count of the protocol's three splits (and of
    # ``pairs``, which ignore ``config.data.max_pairs``); else None.
    num_entities: int | None = None

    @classmethod
    def load(cls, name: str, *, data_dir: str = "", max_pairs: int = 0,
             dtype: str | None = None, remat: bool | None = None,
             overrides: Mapping[str, Any] | None = None, split: str = "dev") -> "ModelData":
        """Model ``name`` (see ``benchmarks.models``) with ``overrides`` (dotted config keys)
        set, and the pairs of ``split`` ("dev", or "dev_train": what a dev_train run trains on)
        of ``data_dir`` (default: ``$TRIP_DATA_DIR``); ``max_pairs`` keeps only the first N
        pairs."""
        config = models.model_config(name, dtype=dtype, remat=remat)
        for key, value in (overrides or {}).items():
            set_config_value(config, key, value)
        config.data.data_dir = data_dir
        if split == "dev_train":
            # The pairs a dev_train run trains on: dev minus its held-out slice.
            config.data.protocol = "dev_train"
        elif split != "dev":
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        splits = protocol.load_protocol_splits(config.data)
        if split == "dev_train":
            pairs = splits.train
        else:
            pairs = readers.load_split(readers.default_data_dir(data_dir or None), "dev")
        if max_pairs:
            pairs = pairs[:max_pairs]
        tokenizer = builders.build_tokenizer(config.model, features.vocabulary_texts(pairs))
        layout = layouts.from_config(config.data)
        encoded = input_pipeline.encode(pairs, tokenizer, layout)
        fixed = layout.for_splits(splits).num_entities
        if fixed is not None:  # the harness's pairs may go beyond config.data.max_pairs
            fixed = max([fixed, *(p.num_entities for p in encoded)])
        return cls(name, config, tokenizer, list(pairs), encoded, fixed)


def set_config_value(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the dotted ``key`` (e.g. "data.layout") of ``config``."""
    *path, leaf = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[leaf] = value


@dataclasses.dataclass
class Harness:
    """One model's config, data, train state and jitted step functions."""

    name: str
    config: ml_collections.ConfigDict
    tokenizer: Any
    encoded: list[EncodedPair]
    hf_config: Any
    trainer: train.Trainer
    state: Any
    num_entities: int | None = None  # ModelData.num_entities

    @property
    def mesh(self):
        """The device mesh the steps run on."""
        return self.trainer.mesh

    @property
    def train_step(self):
        """The jitted train step (``train.make_train_step``)."""
        return self.trainer.train_step

    @property
    def eval_step(self):
        """The jitted eval step (``evaluate.make_eval_step``)."""
        return self.trainer.eval_step

    @classmethod
    def build(cls, name: str, *, data_dir: str = "", max_pairs: int = 0,
              dtype: str | None = None, remat: bool | None = None,
              overrides: Mapping[str, Any] | None = None, split: str = "dev") -> "Harness":
        """Builds model ``name`` on the pairs of ``split`` (arguments: ``ModelData.load``)."""
        data = ModelData.load(name, data_dir=data_dir, max_pairs=max_pairs, dtype=dtype,
                              remat=remat, overrides=overrides, split=split)
        from trip_jax import train  # noqa: PLC0415 - checkpointing imports, not for ModelData

        config = data.config
        hf_config, encoder_params = builders.build_encoder_config(config.model, data.tokenizer)
        model = builders.build_model(config, hf_config)
        trainer = train.build_trainer(config, model, sharding.create_mesh(config.mesh),
                                      _SCHEDULE_STEPS)
        return cls(name, config, data.tokenizer, data.encoded, hf_config, trainer,
                   trainer.fresh_state(encoder_params), data.num_entities)

    @property
    def tiered(self) -> TieredConfig:
        """The tiered architecture the model was built with."""
        return TieredConfig.from_mapping(
            {**self.config.model.tiered.to_dict(),
             "max_sentences": self.config.data.max_sentences})

    @property
    def layout(self) -> Layout:
        """The config's batch layout (``trip_jax.data.layouts``), E fixed as training fixes
        it (``num_entities``)."""
        return dataclasses.replace(layouts.from_config(self.config.data),
                                   num_entities=self.num_entities)

    def layout_named(self, name: str) -> Layout:
        """The layout ``name`` with the config's other data keys, T bucketed, E as ``layout``."""
        data = self.config.data.copy_and_resolve_references()
        data.layout, data.seq_len = name, 0
        return dataclasses.replace(layouts.from_config(data), num_entities=self.num_entities)

    def config_batch(self, pairs: Sequence[EncodedPair]) -> dict[str, np.ndarray]:
        """``pairs`` as one batch of the config's layout and buckets (as training batches)."""
        return next(input_pipeline.batch_stream(pairs, self.layout, len(pairs)))

    def largest_batch(self, batch_size: int) -> tuple[dict[str, np.ndarray], list[EncodedPair]]:
        """The batch of one unshuffled epoch over the pairs at ``batch_size`` (the config's
        layout, E fixed as training fixes it) with the most encoder tokens (ties: the most real
        tokens), and its pairs: the largest batch shape training on these pairs compiles."""
        def size(batch):
            return batch["input_ids"].size, int(batch["attention_mask"].sum())

        best = max(input_pipeline.batch_stream(self.encoded, self.layout, batch_size), key=size)
        return best, [self.encoded[i] for i in best["pair_index"][best["pair_mask"]]]

    def reference_dense_batch(self, pair: EncodedPair) -> dict[str, np.ndarray]:
        """One pair in the reference's layout (see ``reference_dense_shape``)."""
        entities, seq_len = reference_dense_shape(self.encoded)
        return self.layout_named("dense").build(
            [pair], BatchPlan(np.zeros(1, np.int32), entities, {"T": seq_len}), pair.pad_id)

    def layout_summary(self, batch_size: int) -> dict:
        """Padding and compiled shapes of one epoch over the dev pairs at ``batch_size``: real
        rows and real tokens over the encoder rows/tokens of every layout
        (``trip_jax.data.layouts``, the config's other data keys) and of the reference layout,
        and each one's distinct batch shapes (one compilation each)."""
        S = self.config.data.max_sentences
        summary = {"batch_size": batch_size, "pairs": len(self.encoded)}
        for name in layouts.NAMES:
            stats = self.layout_named(name).stats(self.encoded, batch_size)
            summary.update(real_rows=stats["real_rows"], real_tokens=stats["real_tokens"])
            summary[name] = {"rows": stats["rows"], "real_row_fraction": stats["real_fraction"],
                             "tokens": stats["tokens"],
                             "real_token_fraction": stats["token_fraction"],
                             "distinct_shapes": len(stats["shapes"])}
        real_tokens = summary["real_tokens"]
        entities, seq_len = reference_dense_shape(self.encoded)
        rows = len(self.encoded) * 2 * entities * S
        summary["reference_dense"] = {
            "rows": rows, "real_row_fraction": summary["real_rows"] / rows,
            "tokens": rows * seq_len, "real_token_fraction": real_tokens / (rows * seq_len),
            "distinct_shapes": 1, "entities": entities, "seq_len": seq_len}
        return summary

    def to_device(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """The host→device copy the training loop makes (``sharding.global_batch``)."""
        return sharding.global_batch(local, self.mesh)

    def tokenizer_name(self) -> str:
        """What tokenized the rows (for the results)."""
        return builders.tokenizer_spec(self.config.model)


def reference_dense_shape(encoded: Sequence[EncodedPair]) -> tuple[int, int]:
    """(E, T) of the reference layout: the data's most entities and longest row."""
    return (max(p.num_entities for p in encoded), features.max_row_length(encoded))


def representative_indices(encoded: Sequence[EncodedPair], count: int) -> list[int]:
    """Indices of ``count`` pairs at evenly spaced quantiles of the pairs' row counts (the
    median pair for count 1), so that a fixed batch holds about the data's mean rows per pair."""
    if not 1 <= count <= len(encoded):
        raise ValueError(f"cannot pick {count} of {len(encoded)} pairs")
    order = np.argsort([p.num_rows for p in encoded], kind="stable")
    return [int(order[int((i + 0.5) * len(encoded) / count)]) for i in range(count)]


def representative_pairs(encoded: Sequence[EncodedPair], count: int) -> list[EncodedPair]:
    """The pairs of ``representative_indices``."""
    return [encoded[i] for i in representative_indices(encoded, count)]


@dataclasses.dataclass(frozen=True)
class BenchmarkLayout:
    """A batch layout the trip-jax cases time (``benchmarks.train_speed``).

    overrides: dotted config keys set before the model and data are built (``Harness.build``).
    batch: builds the one timed batch from the harness and the case's representative pairs.
    one_pair: batches hold one pair (batch size 1 only), as the reference's did.
    baseline: the reference layout, which the other layouts are compared with (``ratios``).
    """

    overrides: Mapping[str, Any]
    batch: Callable[[Harness, Sequence[EncodedPair]], dict[str, np.ndarray]]
    one_pair: bool = False
    baseline: bool = False


# Every layout the trip-jax cases can time, by name (``benchmarks.run --layouts``). A new
# layout of the data pipeline is one entry: its config keys, and ``Harness.config_batch`` if
# the input pipeline builds its batches.
LAYOUTS: dict[str, BenchmarkLayout] = {
    "packed_tokens": BenchmarkLayout({"data.layout": "packed_tokens", "data.seq_len": 0,
                                      "model.tiered.cells": "real"},
                                     Harness.config_batch),
    # The model config's own layout and keys, unchanged (the paper configs' exact mode).
    "config": BenchmarkLayout({}, Harness.config_batch),
    "reference_dense": BenchmarkLayout(
        {"model.tiered.cells": "grid"}, lambda h, pairs: h.reference_dense_batch(pairs[0]), one_pair=True, baseline=True),
}
