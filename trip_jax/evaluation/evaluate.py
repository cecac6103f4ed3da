"""The evaluator: scoring parameters on story pairs, and the reports of a checkpoint.

``Evaluator(...).run(params)`` is the one eval loop (training, evaluate, predict, benchmarks);
``write_report_set`` writes a report set (``ensemble.evaluate_members``: ``--mode=evaluate``).
Details: README.md#evaluation-and-explanations.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tqdm
from absl import logging
from etils import epath

from trip_jax.config.sections import Config
from trip_jax.config.typed import typed
from trip_jax.data import batch_contract, curated, input_pipeline, protocol
from trip_jax.evaluation import (decoding, explorer, metrics, model_names, random_baseline,
                                 reports)
from trip_jax.evaluation import explain as explain_lib
from trip_jax.runtime import sharding
from trip_jax.training import checkpoints
from trip_jax.data import layouts
from trip_jax.training import step as training_step
from trip_jax.data.features import EncodedPair
from trip_jax.data.layouts import Layout
from trip_jax.data.types import StoryPair

EVAL_DIR = "eval"


def checkpoint_eval_step(restored: checkpoints.EvalModel) -> Callable:
    """The jitted eval step of a restored model on its mesh, with its run's loss settings (one
    per process for equal models: ``training.step.shared_eval_step``)."""
    return training_step.shared_eval_step(restored.model, restored.config.loss, restored.mesh,
                                          restored.param_shardings)


def eval_batch_size(batch_size: int, mesh) -> int:
    """``batch_size`` rounded up to a multiple of the mesh's batch shards (padding pairs are
    masked out), so that any device count can evaluate."""
    shards = sharding.num_batch_shards(mesh)
    return -(-batch_size // shards) * shards


def scalar_metrics(scores: Mapping[str, Any]) -> dict[str, float]:
    """The scalar entries of an evaluation (for logs and checkpoint metadata): the metrics of
    its decoding, each decoding's tiers ("independent/accuracy", ...), the losses and the
    selection score."""
    keys = [k for k in scores if k in metrics.SCALAR_METRICS or k.startswith("loss/")
            or k.split("/")[0] in decoding.DECODINGS or k == "selection_score"]
    return {k: float(scores[k]) for k in keys}


def decoded_metrics(arrays: Mapping[str, np.ndarray], config: decoding.DecodingConfig
                   ) -> tuple[dict[str, Any], decoding.Decoded, dict[str, dict]]:
    """Scores eval-step outputs of N pairs under ``config``'s decoding and, side by side, under
    every decoding: returns (the tiered metrics of ``config.method``, with "decoding" naming it
    and "METHOD/accuracy"-style entries of every decoding's tiers; that decoding's predictions;
    every decoding's ``metrics.pair_outcomes``)."""
    scores, chosen, outcomes = {}, None, {}
    for method in decoding.DECODINGS:
        decoded = decoding.decode(arrays, dataclasses.replace(config, method=method))
        tiered = metrics.TieredArrays.from_mapping({**arrays, **decoded.predictions()})
        result, outcomes[method] = metrics.scored_pairs(tiered)
        scores.update({f"{method}/{key}": result[key] for key in metrics.TIER_METRICS})
        if method == config.method:
            chosen = decoded
            scores = {**result, **scores}
    scores["decoding"] = config.method
    return scores, chosen, outcomes


def pad_entities(value: np.ndarray, entities: int) -> np.ndarray:
    """Pads axis 2 (E) of a [B, 2, E, S, ...] array with zeros (padding rows); an array of
    fewer axes is returned as it is."""
    if value.ndim < 4 or value.shape[2] == entities:
        return value
    extra = entities - value.shape[2]
    widths = [(0, 0)] * value.ndim
    widths[2] = (0, extra)
    return np.pad(value, widths)


@dataclasses.dataclass
class Predictions:
    """The eval step's outputs for every pair, pair axis first, in dataset order.

    ``arrays`` holds the contract's ``PREDICTION_KEYS`` and ``PAIR_KEYS``, the decoding's
    ``LOGIT_KEYS`` and ``ALIAS_KEY`` (each entity's alias group), with E padded to the
    largest batch's; ``losses`` the mean of every loss term over the real pairs.
    """

    arrays: dict[str, np.ndarray]
    losses: dict[str, float]

    def for_pair(self, n: int, pair: StoryPair | EncodedPair) -> dict[str, Any]:
        """Pair ``n``'s predictions cut to its stories: a [2, E, S, ...] output becomes a tuple
        of each story's [E_k, S_k, ...] array, a per-pair output its value."""
        values = {}
        for key in batch_contract.PREDICTION_KEYS:
            value = self.arrays[key][n]
            if value.ndim >= 3:
                value = tuple(value[k, :story.num_entities, :story.num_sentences]
                              for k, story in enumerate(pair.stories))
            values[key] = value
        return values


@dataclasses.dataclass
class Evaluation:
    """Scores of one evaluation and its per-pair records in dataset order."""

    scores: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def scalars(self) -> dict[str, float]:
        """The scalar scores (``scalar_metrics``)."""
        return scalar_metrics(self.scores)


class Evaluator:
    """Scores parameters on fixed story pairs with one jitted eval step.

    Args:
      eval_step: ``training.step.make_eval_step(...)`` (or ``checkpoint_eval_step``).
      pairs: the typed pairs (ids, and the sentences and entities of explanations).
      encoded: ``pairs`` encoded (``input_pipeline.encode``), in the same order.
      layout: the batch layout (``trip_jax.data.layouts``).
      batch_size: global eval batch size in pairs (rounded up to the mesh, ``eval_batch_size``).
      mesh: the mesh the eval step was compiled for.
      explain: add ``explain.explain_pair``'s explanation to every record.
      decoding_config: how predictions are read from the outputs (``decoding.DecodingConfig``; the
        scores of every decoding are reported beside it).
      progress: show a progress bar with ETA over the batches (process 0 only).
    """

    def __init__(self, eval_step: Callable, pairs: Sequence[StoryPair],
                 encoded: Sequence[EncodedPair], layout: Layout, batch_size: int, mesh, *,
                 explain: bool = False, progress: bool = False, desc: str = "eval",
                 decoding_config: decoding.DecodingConfig = decoding.DecodingConfig()):
        if len(pairs) != len(encoded):
            raise ValueError(f"{len(pairs)} pairs but {len(encoded)} encoded pairs")
        self.eval_step = eval_step
        self.pairs = list(pairs)
        self.encoded = list(encoded)
        self.layout = layout
        self.batch_size = eval_batch_size(batch_size, mesh)
        self.mesh = mesh
        self.explain = explain
        self.decoding = decoding_config
        self.progress = progress
        self.desc = desc

    @classmethod
    def for_checkpoint(cls, restored: checkpoints.EvalModel, pairs: Sequence[StoryPair],
                       config: Config, *,
                       splits: protocol.ProtocolSplits | None = None,
                       **kwargs) -> "Evaluator":
        """An evaluator of a restored model on ``pairs``, encoded with its tokenizer and batched
        as ``config`` says, with ``checkpoint_eval_step``; ``splits`` (the protocol's) fix E when
        ``data.entity_padding`` is "data_max" (without them E is bucketed: the predictions are
        the same, the unmasked losses are not)."""
        layout = layouts.from_config(config.data)
        if splits is not None:
            layout = layout.for_splits(splits)
        kwargs.setdefault("decoding_config", config.decoding)
        return cls(checkpoint_eval_step(restored), pairs,
                   input_pipeline.encode(pairs, restored.tokenizer, layout), layout,
                   config.train.eval_batch_size, restored.mesh, **kwargs)

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        stream = input_pipeline.batch_stream(self.encoded, self.layout, self.batch_size,
                                             shards=sharding.local_batch_shards(self.mesh))
        return tqdm.tqdm(stream, total=input_pipeline.num_batches(len(self.encoded),
                                                                  self.batch_size),
                         unit="batch", desc=self.desc, dynamic_ncols=True,
                         disable=not self.progress or jax.process_index() != 0)

    def predict(self, params) -> Predictions:
        """Runs the eval step over every batch; returns every pair's outputs in dataset order."""
        outputs, loss_sums, real_pairs = [], {}, 0
        for local in self._batches():
            out = jax.device_get(self.eval_step(params, input_pipeline.global_batch(local, self.mesh)))
            n = int(out["pair_mask"].sum())
            real_pairs += n
            for key, value in out.pop("loss").items():
                loss_sums[key] = loss_sums.get(key, 0.0) + float(value) * n
            outputs.append(out)
        entities = max(o["row_mask"].shape[2] for o in outputs)
        merged = {}
        for key in outputs[0]:
            parts = [o[key][o["pair_mask"]] for o in outputs]
            if parts[0].ndim >= 4:
                parts = [pad_entities(p, entities) for p in parts]
            merged[key] = np.concatenate(parts)
        order = np.argsort(merged["pair_index"])
        merged = {k: v[order] for k, v in merged.items()}
        merged[decoding.ALIAS_KEY] = decoding.alias_array(
            [[story.entities for story in self.pairs[int(i)].stories]
             for i in merged["pair_index"]], entities)
        return Predictions(merged, {k: v / max(real_pairs, 1) for k, v in loss_sums.items()})

    def run(self, params) -> Evaluation:
        """Scores ``params``: ``score_predictions`` of ``predict(params)``."""
        return score_predictions(self.predict(params), self.pairs, self.decoding,
                                 explain=self.explain)


def score_predictions(predictions: Predictions, pairs: Sequence[StoryPair],
                      decoding_config: decoding.DecodingConfig, *, explain: bool = False
                      ) -> Evaluation:
    """Scores eval-step outputs of ``pairs`` (``Predictions``, in dataset order) under
    ``decoding_config`` (``decoded_metrics``: tiered metrics, every decoding's tiers side by
    side) plus mean losses ("loss/NAME"), with per-pair records (pair id, label, predicted
    story, ``metrics.outcome_record``, every decoding's tiers, the states that decide
    verifiability (``explain.deciding_states``), and with ``explain`` the explanation, naming
    the backing states when decoding is coherent)."""
    merged = predictions.arrays
    scores, decoded, outcomes = decoded_metrics(merged, decoding_config)
    scores.update({f"loss/{k}": v for k, v in predictions.losses.items()})
    records = []
    for n, i in enumerate(merged["pair_index"]):
        pair = pairs[int(i)]
        story_pred = int(decoded.story_pred[n])
        label = int(merged["story_label"][n])
        record = {"pair_id": pair.pair_id, "label": label,
                  "predicted_story": story_pred, "decoding": decoding_config.method,
                  **metrics.outcome_record(outcomes[decoding_config.method], n),
                  "by_decoding": {method: {key: bool(result[key][n]) for key in (
                      "correct", "consistent", "verifiable")}
                      for method, result in outcomes.items()}}
        record["deciding_states"] = explain_lib.deciding_states(
            1 - label, record["gold_conflict"], merged["pre_label"][n], decoded.pre_pred[n],
            merged["eff_label"][n], decoded.eff_pred[n], pair.stories[1 - label].entities,
            pair.stories[1 - label].num_sentences)
        if explain:
            found = decoded.contradictions[n]
            record["explanation"] = explain_lib.explain_pair(
                story_pred, decoded.conflict_prob[n], decoded.pre_pred[n],
                decoded.eff_pred[n], [s.entities for s in pair.stories],
                [s.sentences for s in pair.stories],
                backing=None if found is None else found.as_dict())
        records.append(record)
    return Evaluation(scores, records)


# ------------------------------------------------------------------------------------------
# Reports.


def report_metadata(restored: checkpoints.EvalModel | Any, splits) -> dict[str, Any]:
    """What a checkpoint report says about its origin (``restored``: a restored model or an
    ensemble's member, with config, kind, step and meta): model, checkpoint, protocol, data, the
    story loss weight (0: the story choice of ``decoding.READS_STORY_LOGITS`` is untrained)."""
    return {"model": model_names.model_name(restored.config), "checkpoint": restored.kind,
            "checkpoint_step": restored.step, "epoch": restored.meta.get("epoch"),
            "protocol": splits.protocol, "selection_split": splits.selection_name,
            "selection_metrics": restored.meta.get("metrics", {}),
            "story_loss_weight": float(restored.config.loss.story_weight),
            "data_files": input_pipeline.data_files(splits)}


def checkpoint_name(restored: checkpoints.EvalModel | Any) -> str:
    """A checkpoint's name in report file names: its kind and step, e.g. best_accuracy-1016."""
    return f"{restored.kind}-{restored.step}"


def write_report_set(out_dir: str | os.PathLike, split: str, evaluation: Evaluation,
                     metadata: Mapping[str, Any], splits, pairs: Sequence[StoryPair], *,
                     stem: str | None = None) -> dict[str, Any]:
    """Writes the report of one split (module docstring) as ``out_dir/STEM.*`` (default stem:
    ``split``), with the random baseline of the same ``pairs`` as a comparison row and the
    tiers of the curated and the implicit pairs (``marker_split``), and its explorer page
    ``STEM.html`` (``explorer.write_page``); returns ``reports.write_report``'s paths and
    "explorer"."""
    row = random_baseline.random_baseline(pairs, seeds=random_baseline.SEEDS)
    by_marker = marker_split(splits, split, pairs, evaluation.records)
    stem = stem or split
    paths = reports.write_report(epath.Path(out_dir), split, evaluation.scores, metadata,
                                 evaluation.records, baselines={random_baseline.report_name(): row},
                                 stem=stem, by_marker=by_marker)
    paths["explorer"] = explorer.write_page(
        epath.Path(out_dir) / f"{stem}.html", f"TRIP explorer: {stem}", evaluation.records,
        pairs=pairs, curated=curated.curated_ids(pairs, *_marker_place(splits, split))[0],
        plot_paths=explorer.report_plots(paths), metrics=evaluation.scores, metadata=metadata,
        baselines={random_baseline.report_name(): row}, by_marker=by_marker)
    return paths


def _marker_place(splits: protocol.ProtocolSplits, split: str) -> tuple[str, str]:
    """(the directory of the split's data files, the data split it was read from): where its
    curated marker is."""
    return (os.path.dirname(next(iter(splits.files.values()))),
            curated.source_split(split, splits.protocol))


def marker_scalars(by_marker: Mapping[str, Any]) -> dict[str, float]:
    """The tiers of ``marker_split``'s halves as flat scalars ("curated/accuracy", ...,
    "implicit/num_pairs"); none when the marker was not found."""
    if not by_marker.get("found"):
        return {}
    return {f"{half}/{key}": float(value) for half in curated.SUBSETS
            for key, value in by_marker[half].items()
            if key != "by_decoding" and value is not None}


def marker_split(splits: protocol.ProtocolSplits, split: str, pairs: Sequence[StoryPair],
                 records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``curated.marker_split`` of one protocol split's records, the marker file read from the
    directory of the split's data files ("marker not found" when it is not there)."""
    return curated.split_pairs_by_marker(pairs, records, *_marker_place(splits, split))


def random_baseline_report(config: Config | Any, workdir: str | os.PathLike,
                           split: str = "test", seeds: int = random_baseline.SEEDS
                           ) -> dict[str, Any]:
    """Writes the random baseline's report of ``split`` as ``WORKDIR/eval/random_baseline.SPLIT.*``.

    Returns {"metrics": ``random_baseline.random_baseline``'s result, "paths": written files}.
    ``config``: typed, or a ConfigDict it is built from (``trip_jax.config.typed``).
    """
    splits = input_pipeline.load_splits(typed(config).data)
    pairs = input_pipeline.split_pairs(splits, split)
    scores = random_baseline.random_baseline(pairs, seeds)
    logging.info("random baseline on %s (%d pairs, %d seeds): accuracy %.3f consistency %.3f "
                 "verifiability %.3f", split, len(pairs), seeds, scores["accuracy"],
                 scores["consistency"], scores["verifiability"])
    paths = {}
    if jax.process_index() == 0:
        metadata = {"model": random_baseline.report_name(seeds), "seeds": seeds,
                    "scheme": scores["scheme"], "protocol": splits.protocol,
                    "data_files": input_pipeline.data_files(splits)}
        paths = reports.write_report(epath.Path(workdir) / EVAL_DIR, f"random_baseline.{split}",
                                     scores, metadata)
    return {"metrics": scores, "paths": paths}
