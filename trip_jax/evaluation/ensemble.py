"""Seed ensembles: several trained models' beliefs averaged and decoded as one model's.

``member_outputs`` runs each member (a trained workdir) once, one at a time; ``average`` turns
their outputs into one model's; ``evaluate_ensemble`` writes
``WORKDIR/eval/SPLIT.ensemble-N-KIND.*`` with each member's tiers and votes. Details: docs/reference.md#ensembles.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from trip_jax.config.sections import Config
from trip_jax.config.typed import typed
from trip_jax.data import batch_contract, input_pipeline
from trip_jax.evaluation import decoding, evaluate, metrics, model_names
from trip_jax.models.tiered import NEG_LOGIT
from trip_jax.training import checkpoints

# The tiers and F1s shown per member.
MEMBER_METRICS: tuple[str, ...] = (*metrics.TIER_METRICS, "precondition_f1", "effect_f1",
                                   "conflict_f1")


class EnsembleError(ValueError):
    """A member cannot join the ensemble; the message names it and the difference."""


def fit_signature(config: Config, protocol: str | None) -> dict[str, Any]:
    """What averaging needs equal in every member: the label space (``data.max_sentences``
    sentence slots) and the data split it was trained on (protocol, and the held-out slice or
    fold that protocol reads)."""
    data = config.data
    protocol = protocol or data.protocol
    signature = {"data.max_sentences": data.max_sentences, "protocol": protocol,
                 "data.max_pairs": data.max_pairs}
    if protocol == "dev_train":
        signature.update({"data.holdout_fraction": data.holdout_fraction,
                          "data.holdout_seed": data.holdout_seed})
    if protocol == "dev_cv":
        signature.update({"data.folds": data.folds, "data.fold": data.fold})
    return signature


def check_fit(member: str, signature: Mapping[str, Any], first: str,
              first_signature: Mapping[str, Any]) -> None:
    """EnsembleError in one line when ``signature`` differs from the first member's."""
    keys = sorted(set(signature) | set(first_signature))
    if signature.get("protocol") != first_signature.get("protocol"):
        keys = ["protocol"]  # the other keys follow from it
    differences = [f"{key} {signature.get(key)!r} (member {first}: {first_signature.get(key)!r})"
                   for key in keys if signature.get(key) != first_signature.get(key)]
    if differences:
        raise EnsembleError(f"member {member} does not fit the ensemble: "
                            + "; ".join(differences))


def check_members(workdirs: Sequence[str]) -> list[str]:
    """The member workdirs, each once; EnsembleError naming a repeated one or an empty list."""
    if not workdirs:
        raise EnsembleError("--members names no workdir")
    seen = {}
    for workdir in workdirs:
        key = os.path.normpath(os.path.abspath(workdir)) if "://" not in workdir else workdir
        if key in seen:
            raise EnsembleError(f"member {workdir} is given twice (also as {seen[key]})")
        seen[key] = workdir
    return list(workdirs)


@dataclasses.dataclass
class Member:
    """One member's facts and its outputs (``evaluate.Predictions``) on the pairs."""

    name: str            # model_names.config_label of its config
    folder: str          # its workdir's folder name (reports never name a path)
    checkpoint: str      # its checkpoint's kind
    step: int
    config: Config
    predictions: evaluate.Predictions

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts for reports (no outputs)."""
        return {"name": self.name, "workdir": self.folder, "checkpoint": self.checkpoint,
                "checkpoint_step": self.step}


def member_outputs(workdirs: Sequence[str], which: str | int,
                   run: Callable[[checkpoints.EvalModel, int], evaluate.Predictions]
                   ) -> Iterator[Member]:
    """Restores each member in turn, checks that it fits the first, and yields its
    ``run(restored, index)`` outputs (members of equal models share one eval step:
    ``evaluate.checkpoint_eval_step``); the restored parameters are dropped before the next
    member is restored. Raises EnsembleError (a member that does not fit) or
    CheckpointError (a missing or damaged checkpoint)."""
    first = None
    for index, workdir in enumerate(check_members(workdirs)):
        restored = checkpoints.restore_for_eval(str(workdir), which)
        signature = fit_signature(restored.config, restored.meta.get("protocol"))
        folder = workdir_name(workdir)
        if first is None:
            first = (folder, signature)
        check_fit(folder, signature, *first)
        predictions = run(restored, index)
        member = Member(model_names.config_label(restored.config), folder, restored.kind,
                        restored.step, restored.config, predictions)
        del restored
        yield member


def _pad_aliases(alias: np.ndarray, entities: int) -> np.ndarray:
    """``decoding.ALIAS_KEY`` [N, 2, E] widened to ``entities``: padding rows in groups of their
    own, as ``decoding.alias_array`` gives them."""
    pads = np.broadcast_to(np.arange(alias.shape[2], entities),
                           (*alias.shape[:2], entities - alias.shape[2]))
    return np.concatenate([alias, pads], axis=2)


def _softmax(logits: np.ndarray) -> np.ndarray:
    return np.exp(decoding.log_softmax(logits))


def average(members: Sequence[evaluate.Predictions], names: Sequence[str] | None = None
            ) -> evaluate.Predictions:
    """The ensemble's eval-step outputs from its members' (each in dataset order).

    Per cell, the members' state distributions (softmax of the logits) and conflict beliefs
    (sigmoid) are averaged and given back as logits (log of the mean distribution; log-odds of
    the mean belief), the story scores averaged; the predictions are read off them as the model
    reads its own (argmax, 0 on padding cells). E is padded to the largest member's. The gold
    arrays (``batch_contract.PAIR_KEYS``) and the alias groups must be equal in every member
    (the same pairs): EnsembleError otherwise. Losses are not averaged (none are given).
    """
    if not members:
        raise EnsembleError("an ensemble needs at least one member")
    names = list(names or [f"#{m + 1}" for m in range(len(members))])
    entities = max(p.arrays["row_mask"].shape[2] for p in members)
    arrays = [{k: _pad_aliases(v, entities) if k == decoding.ALIAS_KEY
               else evaluate.pad_entities(np.asarray(v), entities) for k, v in p.arrays.items()}
              for p in members]
    first = arrays[0]
    for name, other in zip(names[1:], arrays[1:]):
        for key in (*batch_contract.PAIR_KEYS, decoding.ALIAS_KEY):
            if key in first and not np.array_equal(first[key], other.get(key)):
                raise EnsembleError(f"member {name} was run on other pairs than member "
                                    f"{names[0]} ({key} differs)")
        for key in batch_contract.LOGIT_KEYS:
            if other[key].shape != first[key].shape:
                raise EnsembleError(f"member {name} does not fit the ensemble: {key} of shape "
                                    f"{other[key].shape} (member {names[0]}: {first[key].shape})")
    out = {k: v for k, v in first.items() if k in batch_contract.PAIR_KEYS
           or k == decoding.ALIAS_KEY}
    row_mask = np.asarray(first["row_mask"], bool)
    with np.errstate(divide="ignore"):
        for key, pred in (("pre_logits", "pre_pred"), ("eff_logits", "eff_pred")):
            probability = sum(_softmax(a[key]) for a in arrays) / len(arrays)
            out[key] = np.where(probability > 0, np.log(probability), NEG_LOGIT)
            out[pred] = np.where(row_mask[..., None], np.argmax(out[key], axis=-1), 0
                                 ).astype(np.int32)
    belief = sum(1.0 / (1.0 + np.exp(-np.asarray(a["conflict_logits"], np.float64)))
                 for a in arrays) / len(arrays)
    belief = np.clip(belief, 1e-300, 1.0 - 1e-16)
    out["conflict_logits"] = np.log(belief) - np.log1p(-belief)
    out["conflict_prob"] = np.where(row_mask, belief, 0.0)
    out["story_logits"] = sum(np.asarray(a["story_logits"], np.float64)
                              for a in arrays) / len(arrays)
    out["story_pred"] = np.argmax(out["story_logits"], axis=-1).astype(np.int32)
    return evaluate.Predictions(out, {})


def votes(member_records: Sequence[Sequence[Mapping[str, Any]]], names: Sequence[str],
          n: int) -> dict[str, Any]:
    """Pair ``n``'s member votes: {"members": [{name, story, conflict, correct, consistent,
    verifiable}], "members_agree": every member chose the same story and the same conflicting
    sentences}. ``member_records``: each member's ``score_predictions`` records."""
    members = []
    for name, records in zip(names, member_records, strict=True):
        record = records[n]
        members.append({"name": name, "story": record["predicted_story"],
                         "conflict": record["predicted_conflict"],
                         **{key: record[key] for key in ("correct", "consistent", "verifiable")}})
    return with_agreement(members)


def with_agreement(members: list[dict[str, Any]]) -> dict[str, Any]:
    """{"members": members, "members_agree": every member (a dict with "story" and "conflict")
    chose the same story and the same conflicting sentences}."""
    agree = len({(m["story"], tuple(m["conflict"])) for m in members}) == 1
    return {"members": members, "members_agree": agree}


def spread(values: Sequence[float]) -> dict[str, float]:
    """{"mean", "min", "max"} of ``values``."""
    return {"mean": float(np.mean(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def ensemble_name(names: Sequence[str]) -> str:
    """``ensemble of N (member names)``, or the user's ``--name``."""
    return model_names.named_or(f"ensemble of {len(names)} ({', '.join(names)})")


def evaluate_ensemble(config: Config | Any, workdir: str | os.PathLike,
                      members: Sequence[str], which: str | int = checkpoints.SELECTED,
                      split: str = "test", *, progress: bool = False) -> dict[str, Any]:
    """Scores the ensemble of ``members`` (trained workdirs, checkpoint ``which`` of each) on
    ``split`` of ``config``'s data, decoded with ``config.decoding``, and writes
    ``WORKDIR/eval/SPLIT.ensemble-N-KIND.*`` (the report set of ``--mode=evaluate`` with the
    members' tiers, their mean and min-max, and per pair their votes).

    Returns {"metrics", "members": [facts with "metrics"], "paths"}. Raises EnsembleError or
    CheckpointError naming the member that cannot join.
    """
    config = typed(config)
    splits = input_pipeline.load_splits(config.data)
    pairs = input_pipeline.split_pairs(splits, split)
    count = len(members)

    def run(restored, index):
        if restored.meta.get("protocol") not in (None, splits.protocol):
            logging.warning("member %s was selected under protocol %s; scoring under %s",
                            workdir_name(members[index]), restored.meta["protocol"],
                            splits.protocol)
        evaluator = evaluate.Evaluator.for_checkpoint(
            restored, pairs, restored.config, splits=splits, progress=progress,
            desc=f"{split} {index + 1}/{count}")
        return evaluator.predict(restored.params)

    kept, member_records, facts = [], [], []
    for member in member_outputs(members, which, run):
        evaluation = evaluate.score_predictions(member.predictions, pairs, config.decoding)
        scores = {key: evaluation.scores[key] for key in MEMBER_METRICS}
        logging.info("member %s (%s-%d): accuracy %.3f consistency %.3f verifiability %.3f",
                     member.folder, member.checkpoint, member.step, scores["accuracy"],
                     scores["consistency"], scores["verifiability"])
        kept.append(member)
        member_records.append(evaluation.records)
        facts.append({**member.facts(), "metrics": scores,
                      "story_loss_weight": float(member.config.loss.story_weight)})
    names = [m.name for m in kept]
    predictions = average([m.predictions for m in kept], [m.folder for m in kept])
    evaluation = evaluate.score_predictions(predictions, pairs, config.decoding, explain=True)
    for n, record in enumerate(evaluation.records):
        record.update(votes(member_records, names, n))
    scores = evaluation.scores
    logging.info("ensemble of %d on %s: accuracy %.3f consistency %.3f verifiability %.3f",
                 count, split, scores["accuracy"], scores["consistency"],
                 scores["verifiability"])
    weights = {f["story_loss_weight"] for f in facts}
    metadata = {
        "model": ensemble_name(names), "checkpoint": str(which), "protocol": splits.protocol,
        "selection_split": splits.selection_name,
        "story_loss_weight": weights.pop() if len(weights) == 1 else None,
        "data_files": input_pipeline.data_files(splits),
        "members": facts,
        "members_spread": {key: spread([f["metrics"][key] for f in facts])
                           for key in MEMBER_METRICS},
        "members_agree": sum(r["members_agree"] for r in evaluation.records)}
    paths = {}
    if jax.process_index() == 0:
        paths = evaluate.write_report_set(
            epath.Path(workdir) / evaluate.EVAL_DIR, split, evaluation, metadata, splits, pairs,
            stem=f"{split}.ensemble-{count}-{which}")
    return {"metrics": scores, "members": facts, "paths": paths}


def workdir_name(workdir: str) -> str:
    """A member's name in messages: its folder's name."""
    return epath.Path(workdir).name or str(workdir)
