"""The real training objects of one model, built the way ``trip_jax.train`` builds them.

``Harness.build`` reads the dev pairs from ``$TRIP_DATA_DIR``, tokenizes them with the model's
tokenizer (``trip_jax.input_pipeline``), and creates the mesh, the model and, with
``train.build_trainer`` (as training does), the optimizer, the train state and the jitted train
and eval steps. The benchmarks time exactly those step functions (encoder + heads + detector +
loss + optimizer update).

Also here: the batches the benchmarks feed them. ``representative_pairs`` picks B pairs spread
over the dev set's row-count distribution (so a fixed batch has about the mean pair size), and
``reference_dense_batch`` lays one pair out as the reference did: padded to the data's largest
entity count, sentence count and row length, one pair a batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from benchmarks import models
from trip_jax import builders, input_pipeline, sharding, train
from trip_jax.data import batching, features, readers
from trip_jax.data.features import Buckets, EncodedPair
from trip_jax.input_pipeline import Layout
from trip_jax.models.tiered import TieredConfig

# Steps the optimizer schedule is built for (the constant schedule ignores it).
_SCHEDULE_STEPS = 10_000


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
              short_seq_len: int | None = None) -> "Harness":
        """Builds model ``name`` (see ``benchmarks.models``) on the dev pairs of ``data_dir``
        (default: ``$TRIP_DATA_DIR``); ``max_pairs`` keeps only the first N pairs."""
        config = models.model_config(name, dtype=dtype, remat=remat, short_seq_len=short_seq_len)
        config.data.data_dir = data_dir
        pairs = readers.load_split(readers.default_data_dir(data_dir or None), "dev")
        if max_pairs:
            pairs = pairs[:max_pairs]
        tokenizer = builders.build_tokenizer(config.model, features.vocabulary_texts(pairs))
        encoded = input_pipeline.encode(pairs, tokenizer, Layout.from_config(config.data))
        hf_config, encoder_params = builders.build_encoder_config(config.model, tokenizer)
        model = builders.build_model(config, hf_config)
        trainer = train.build_trainer(config, model, sharding.create_mesh(config.mesh),
                                      _SCHEDULE_STEPS)
        return cls(name, config, tokenizer, encoded, hf_config, trainer,
                   trainer.fresh_state(encoder_params))

    @property
    def tiered(self) -> TieredConfig:
        """The tiered architecture the model was built with."""
        return TieredConfig.from_mapping(
            {**self.config.model.tiered.to_dict(),
             "max_sentences": self.config.data.max_sentences})

    @property
    def layout(self) -> Layout:
        """The config's batch layout (``input_pipeline.Layout``)."""
        return Layout.from_config(self.config.data)

    @property
    def buckets(self) -> Buckets:
        """The config's shape buckets."""
        return self.layout.buckets

    @property
    def seq_len(self) -> int | None:
        """The config's fixed token length, or None (bucketed per batch)."""
        return self.layout.seq_len

    def packed_batch(self, pairs: Sequence[EncodedPair]) -> dict[str, np.ndarray]:
        """``pairs`` as one packed batch with the config's buckets (the training layout)."""
        layout = dataclasses.replace(self.layout, layout="packed")
        return next(input_pipeline.batch_stream(pairs, layout, len(pairs)))

    def reference_dense_batch(self, pair: EncodedPair) -> dict[str, np.ndarray]:
        """One pair in the reference's layout (see ``reference_dense_shape``)."""
        entities, seq_len = reference_dense_shape(self.encoded)
        return features.build_batch([pair], [0], layout="dense", num_entities=entities,
                                    seq_len=seq_len, pad_id=pair.pad_id,
                                    max_sentences=self.config.data.max_sentences)

    def layout_summary(self, batch_size: int) -> dict:
        """Padding and compiled shapes of one epoch over the dev pairs at ``batch_size``: real
        rows and real tokens over the encoder rows/tokens of the packed layout (with the
        config's short-row group), of batching's dense layout and of the reference layout, and
        each one's distinct batch shapes (one compilation each)."""
        S = self.config.data.max_sentences
        stats = batching.layout_stats(self.encoded, batch_size, buckets=self.buckets,
                                      seq_len=self.seq_len, max_sentences=S,
                                      short_seq_len=self.layout.short_seq_len)
        real_tokens = stats["real_tokens"]
        summary = {"batch_size": batch_size, "pairs": len(self.encoded),
                   "real_rows": stats["real_rows"], "real_tokens": real_tokens}
        for layout in features.LAYOUTS:
            summary[layout] = {"rows": stats[f"{layout}_rows"],
                               "real_row_fraction": stats[f"{layout}_real_fraction"],
                               "tokens": stats[f"{layout}_tokens"],
                               "real_token_fraction": stats[f"{layout}_token_fraction"],
                               "distinct_shapes": len(stats[f"{layout}_shapes"])}
        entities, seq_len = reference_dense_shape(self.encoded)
        rows = len(self.encoded) * 2 * entities * S
        summary["reference_dense"] = {
            "rows": rows, "real_row_fraction": stats["real_rows"] / rows,
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


def representative_pairs(encoded: Sequence[EncodedPair], count: int) -> list[EncodedPair]:
    """``count`` pairs at evenly spaced quantiles of the pairs' row counts (the median pair for
    count 1), so that a fixed batch holds about the data's mean rows per pair."""
    if not 1 <= count <= len(encoded):
        raise ValueError(f"cannot pick {count} of {len(encoded)} pairs")
    order = np.argsort([p.num_rows for p in encoded], kind="stable")
    return [encoded[order[int((i + 0.5) * len(encoded) / count)]] for i in range(count)]
