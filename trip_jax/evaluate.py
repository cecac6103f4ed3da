"""Scoring a saved checkpoint on one split, and the random baseline, with their reports.

``evaluate_checkpoint(config, workdir, which, split)`` (``--mode=evaluate``) rebuilds the model
from the workdir alone (``checkpoints.restore_for_eval``: the saved config, encoder config and
tokenizer), reads ``split`` of the protocol that ``config.data`` describes, scores it with the
training run's eval step (``train.evaluate``) and writes under ``WORKDIR/eval/``:

- ``SPLIT.json``: checkpoint kind and step, protocol, data files' sha256, and every metric;
- ``SPLIT.predictions.jsonl``: one line per pair: its outcome (``metrics.outcome_record``:
  correct / consistent / verifiable, predicted and gold conflict sets) and its explanation
  (``explain.explain_pair``: predicted story, conflicting pair, the states behind it, in words);
- ``SPLIT.md``: the layout of Tables 2-4, with the random baseline on the same pairs as a row;
- ``SPLIT.failure_modes.png`` and ``SPLIT.attributes.png``.

``config`` supplies the data (directory, protocol, pair limit) and the batching; its model must be
the checkpoint's (else ``checkpoints.CheckpointError``). Training's final test reports are written
by ``write_checkpoint_report`` too, so both paths give the same files.

``random_baseline_report(config, workdir, split)`` (``--mode=random_baseline``) writes the report
of the random baseline (``trip_jax.random_baseline``; every metric averaged over the seeds) as
``WORKDIR/eval/random_baseline.SPLIT.*``; it needs no checkpoint.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from trip_jax import builders, checkpoints, losses, metrics, protocol, reports, sharding, train
from trip_jax import random_baseline as baseline
from trip_jax.data import features
from trip_jax.data.types import StoryPair

EVAL_DIR = "eval"
BASELINE_SEEDS = 10


class EvaluationError(ValueError):
    """The requested evaluation cannot run (e.g. a split the protocol does not have)."""


def model_name(config: ml_collections.ConfigDict) -> str:
    """The model's row name in reports: the encoder, or "random bert" for a random encoder."""
    return config.model.encoder or f"random {config.model.random_encoder.model_type}"


def baseline_name(seeds: int = BASELINE_SEEDS) -> str:
    """The random baseline's row name in reports."""
    return f"random baseline ({seeds} seeds)"


def split_names(splits: protocol.ProtocolSplits) -> dict[str, list[StoryPair]]:
    """The splits of a protocol by name: "train", the selection split's name, "test"."""
    return {"train": splits.train, splits.selection_name: splits.selection, "test": splits.test}


def split_pairs(splits: protocol.ProtocolSplits, split: str) -> list[StoryPair]:
    """The pairs of ``split``; EvaluationError (listing the valid names) for an unknown one."""
    named = split_names(splits)
    if split not in named:
        raise EvaluationError(f"protocol {splits.protocol} has no split {split!r}; choose one of "
                              f"{', '.join(sorted(named))}")
    if not named[split]:
        raise EvaluationError(f"split {split!r} of protocol {splits.protocol} has no pairs")
    return named[split]


def eval_config(config: ml_collections.ConfigDict, mesh) -> ml_collections.ConfigDict:
    """A copy of ``config`` whose eval batch size splits over ``mesh`` (rounded up: padding
    pairs are masked out), so any device count can evaluate."""
    shards = sharding.num_batch_shards(mesh)
    copy = config.copy_and_resolve_references()
    copy.train.eval_batch_size = -(-config.train.eval_batch_size // shards) * shards
    return copy


def checkpoint_eval_step(restored: checkpoints.EvalModel):
    """The jitted eval step (predictions, labels, losses) of a restored model on its mesh."""
    saved = restored.config
    return train.make_eval_step(restored.model, losses.LossConfig.from_mapping(saved.loss),
                                restored.mesh, restored.param_shardings)


def encode(pairs: Sequence[StoryPair], tokenizer, config) -> list[features.EncodedPair]:
    """Tokenizes ``pairs`` with a run's tokenizer, as ``config.data`` says."""
    return features.encode_pairs(pairs, tokenizer, max_sentences=config.data.max_sentences,
                                 max_length=config.data.max_length or None)


def data_files(splits: protocol.ProtocolSplits) -> dict[str, str]:
    """{path: sha256} of the data files the protocol read."""
    return reports.data_file_hashes(sorted(set(splits.files.values())))


def report_metadata(restored: checkpoints.EvalModel, splits: protocol.ProtocolSplits
                    ) -> dict[str, Any]:
    """What a checkpoint report says about its origin: model, checkpoint, protocol, data."""
    return {"model": model_name(restored.config), "checkpoint": restored.kind,
            "checkpoint_step": restored.step, "epoch": restored.meta.get("epoch"),
            "protocol": splits.protocol, "selection_split": splits.selection_name,
            "selection_metrics": restored.meta.get("metrics", {}),
            "data_files": data_files(splits)}


def write_checkpoint_report(out_dir: str | os.PathLike, split: str,
                            scores: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                            restored: checkpoints.EvalModel, splits: protocol.ProtocolSplits,
                            pairs: Sequence[StoryPair]) -> dict[str, pathlib.Path]:
    """Writes a checkpoint's report of one split (module docstring), with the random baseline
    of the same ``pairs`` as a comparison row; returns ``reports.write_report``'s paths."""
    row = baseline.random_baseline(pairs, seeds=BASELINE_SEEDS)
    return reports.write_report(out_dir, split, scores,
                                report_metadata(restored, splits), records,
                                baselines={baseline_name(): row})


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        which: str | int = checkpoints.BEST_VERIFIABILITY,
                        split: str = "test") -> dict[str, Any]:
    """Scores checkpoint ``which`` of ``workdir`` on ``split`` and writes ``WORKDIR/eval/``.

    Args:
      config: the run's config (or one with the same model): data location, protocol, batching.
      workdir: the training run's directory.
      which: "best_verifiability", "best_accuracy", "latest" or a step number.
      split: "test", the protocol's selection split ("dev" / "dev_holdout") or "train".

    Returns:
      {"metrics": tiered metrics + mean losses, "step", "checkpoint", "paths": written files}.

    Raises:
      checkpoints.CheckpointError: no such checkpoint, unreadable, or another model's.
      EvaluationError: the protocol has no such split.
    """
    splits = protocol.load_protocol_splits(config.data)
    pairs = split_pairs(splits, split)
    restored = checkpoints.restore_for_eval(str(workdir), which, config=config)
    if restored.meta.get("protocol") not in (None, splits.protocol):
        logging.warning("the checkpoint was selected under protocol %s; scoring under %s",
                        restored.meta["protocol"], splits.protocol)
    cfg = eval_config(config, restored.mesh)
    scores, records = train.evaluate(
        checkpoint_eval_step(restored), restored.params,
        encode(pairs, restored.tokenizer, cfg), cfg, restored.mesh,
        [p.pair_id for p in pairs], pairs=pairs)
    logging.info("%s (%s, step %d, protocol %s): accuracy %.3f consistency %.3f "
                 "verifiability %.3f", split, restored.kind, restored.step, splits.protocol,
                 scores["accuracy"], scores["consistency"], scores["verifiability"])
    paths = {}
    if jax.process_index() == 0:
        paths = write_checkpoint_report(epath.Path(workdir) / EVAL_DIR, split, scores, records,
                                        restored, splits, pairs)
    return {"metrics": scores, "step": restored.step, "checkpoint": restored.kind,
            "paths": paths}


def _mean(values: list[Any]) -> Any:
    """Mean of parallel metric trees: dicts by key, lists by position, numbers averaged
    (NaN values skipped), values equal in every tree (flags, names, sizes) kept as they are."""
    first = values[0]
    if isinstance(first, Mapping):
        return {key: _mean([v[key] for v in values]) for key in first}
    if isinstance(first, list):
        return [_mean(list(items)) for items in zip(*values)]
    if all(v == first for v in values):
        return first
    finite = [float(v) for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def random_baseline_metrics(pairs: Sequence[StoryPair], seeds: int = BASELINE_SEEDS,
                            scheme: str = "tiered") -> dict[str, Any]:
    """Every ``tiered_metrics`` entry of the random baseline, averaged over seeds 0..seeds-1.

    Same draws as ``random_baseline.random_baseline`` (so the same scalar means); failure-mode
    counts and per-attribute values are averaged too, for the report's tables and plots.
    """
    labels = baseline.label_arrays(pairs)
    per_seed = []
    for seed in range(seeds):
        preds = baseline.random_predictions(labels, np.random.default_rng(seed), scheme)
        per_seed.append(metrics.tiered_metrics(
            labels["story_label"], preds["story_pred"], labels["conflict_label"],
            preds["conflict_prob"], labels["pre_label"], preds["pre_pred"], labels["eff_label"],
            preds["eff_pred"], labels["mask"]))
    return _mean(per_seed)


def random_baseline_report(config: ml_collections.ConfigDict, workdir: str,
                           split: str = "test", seeds: int = BASELINE_SEEDS
                           ) -> dict[str, Any]:
    """Writes the random baseline's report of ``split`` as ``WORKDIR/eval/random_baseline.SPLIT.*``.

    Returns {"metrics": the averaged metrics, "paths": written files}.
    """
    splits = protocol.load_protocol_splits(config.data)
    pairs = split_pairs(splits, split)
    scores = random_baseline_metrics(pairs, seeds)
    logging.info("random baseline on %s (%d pairs, %d seeds): accuracy %.3f consistency %.3f "
                 "verifiability %.3f", split, len(pairs), seeds, scores["accuracy"],
                 scores["consistency"], scores["verifiability"])
    paths = {}
    if jax.process_index() == 0:
        metadata = {"model": baseline_name(seeds), "seeds": seeds, "scheme": "tiered",
                    "protocol": splits.protocol, "data_files": data_files(splits)}
        paths = reports.write_report(pathlib.Path(workdir) / EVAL_DIR,
                                     f"random_baseline.{split}", scores, metadata)
    return {"metrics": scores, "paths": paths}
