"""One model or several: a checkpoint is an ensemble of one, several members' beliefs averaged.

``member_outputs`` runs each member (a trained workdir) once, one at a time; ``average`` turns
their outputs into one model's (one member's as they are); ``evaluate_members`` is
``--mode=evaluate``, ``votes`` the members' choices per pair. Details: docs/reference.md#ensembles.
"""

from __future__ import annotations

import dataclasses
import functools
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

    folder: str          # its workdir's folder name (reports never name a path)
    kind: str            # its checkpoint's kind
    step: int
    config: Config       # the config it was trained with
    meta: dict[str, Any]  # its checkpoint's metadata (epoch, selection metrics)
    predictions: evaluate.Predictions

    @property
    def name(self) -> str:
        """Its model's name (``model_names.config_label`` of its config)."""
        return model_names.config_label(self.config)

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts for reports (no outputs)."""
        return {"name": self.name, "workdir": self.folder, "checkpoint": self.kind,
                "checkpoint_step": self.step}


def member_outputs(workdirs: Sequence[str], which: str | int,
                   run: Callable[[checkpoints.EvalModel, int], evaluate.Predictions],
                   config: Config | None = None) -> Iterator[Member]:
    """Restores each member in turn (with ``config``, one whose model differs is a
    CheckpointError), checks that it fits the first, and yields its ``run(restored, index)``
    outputs (members of equal models share one eval step: ``evaluate.checkpoint_eval_step``);
    the restored parameters are dropped before the next member is restored. Raises
    EnsembleError (a member that does not fit) or CheckpointError (a missing or damaged
    checkpoint)."""
    first = None
    for index, workdir in enumerate(check_members(workdirs)):
        restored = checkpoints.restore_for_eval(str(workdir), which, config=config)
        signature = fit_signature(restored.config, restored.meta.get("protocol"))
        folder = workdir_name(workdir)
        if first is None:
            first = (folder, signature)
        check_fit(folder, signature, *first)
        predictions = run(restored, index)
        member = Member(folder, restored.kind, restored.step, restored.config, restored.meta,
                        predictions)
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
    """The ensemble's eval-step outputs from its members' (each in dataset order); one member's
    are returned as they are (an ensemble of one is that model).

    Per cell, the members' state distributions (softmax of the logits) and conflict beliefs
    (sigmoid) are averaged and given back as logits (log of the mean distribution; log-odds of
    the mean belief), the story scores averaged; the predictions are read off them as the model
    reads its own (argmax, 0 on padding cells). E is padded to the largest member's. The gold
    arrays (``batch_contract.PAIR_KEYS``) and the alias groups must be equal in every member
    (the same pairs): EnsembleError otherwise. Losses are not averaged (none are given).
    """
    if not members:
        raise EnsembleError("an ensemble needs at least one member")
    if len(members) == 1:
        return members[0]
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


def votes(names: Sequence[str], choices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One pair's member votes: {"members": [{"name", **choice}], "members_agree": every member
    chose the same story and the same conflicting sentences}; a choice is {"story", "conflict",
    ...} (``scored_choice``, ``decoded_choice``)."""
    members = [{"name": name, **choice} for name, choice in zip(names, choices, strict=True)]
    agree = len({(m["story"], tuple(m["conflict"])) for m in members}) == 1
    return {"members": members, "members_agree": agree}


def scored_choice(record: Mapping[str, Any]) -> dict[str, Any]:
    """A member's choice in a ``score_predictions`` record: its story, conflicting sentences
    and three tiers."""
    return {"story": record["predicted_story"], "conflict": record["predicted_conflict"],
            **{key: record[key] for key in ("correct", "consistent", "verifiable")}}


def decoded_choice(decoded: decoding.Decoded, n: int) -> dict[str, Any]:
    """A member's choice for pair ``n`` of its decoded outputs: its story and the sentences of
    the other story it believes (>= 0.5) conflicting."""
    story = int(decoded.story_pred[n])
    believed = (decoded.conflict_prob[n][1 - story] >= 0.5).any(axis=0)
    return {"story": story, "conflict": [int(s) for s in np.flatnonzero(believed)]}


def spread(values: Sequence[float]) -> dict[str, float]:
    """{"mean", "min", "max"} of ``values``."""
    return {"mean": float(np.mean(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def ensemble_name(names: Sequence[str]) -> str:
    """``ensemble of N (member names)``, or the user's ``--name``."""
    return model_names.named_or(f"ensemble of {len(names)} ({', '.join(names)})")


def evaluate_members(config: Config | Any, workdir: str | os.PathLike,
                     which: str | int = checkpoints.SELECTED, split: str = "test", *,
                     members: Sequence[str] = (), progress: bool = False) -> dict[str, Any]:
    """Scores checkpoint ``which`` of ``members`` (trained workdirs; none: ``workdir`` itself,
    whose checkpoint must fit ``config`` and runs with it) on ``split`` of ``config``'s data,
    decoded with ``config.decoding``, and writes the report set into ``WORKDIR/eval/``: one
    model's ``SPLIT.KIND-STEP.*``; several members' ``SPLIT.ensemble-N-KIND.*``, with their
    tiers, their mean and min-max, and per pair their votes.

    Returns {"metrics", "members": [facts with "metrics"], "paths"}. Raises EnsembleError or
    CheckpointError naming the member that cannot join (the checkpoint is read before the
    data), input_pipeline.UnknownSplitError for a split the protocol lacks.
    """
    config = typed(config)
    sources = check_members(list(members) or [str(workdir)])
    count = len(sources)

    @functools.cache
    def data():
        splits = input_pipeline.load_splits(config.data)
        return splits, input_pipeline.split_pairs(splits, split)

    def run(restored, index):
        splits, pairs = data()
        if restored.meta.get("protocol") not in (None, splits.protocol):
            logging.warning("%s was selected under protocol %s; scoring under %s",
                            workdir_name(sources[index]), restored.meta["protocol"],
                            splits.protocol)
        evaluator = evaluate.Evaluator.for_checkpoint(
            restored, pairs, restored.config if members else config, splits=splits,
            progress=progress, desc=split if count == 1 else f"{split} {index + 1}/{count}")
        return evaluator.predict(restored.params)

    kept = list(member_outputs(sources, which, run, None if members else config))
    splits, pairs = data()
    predictions = average([m.predictions for m in kept], [m.folder for m in kept])
    evaluation = evaluate.score_predictions(predictions, pairs, config.decoding, explain=True)
    facts, metadata, stem = _report(kept, evaluation, pairs, config, splits, which)
    scores = evaluation.scores
    logging.info("%s on %s: accuracy %.3f consistency %.3f verifiability %.3f",
                 metadata["model"], split, scores["accuracy"], scores["consistency"],
                 scores["verifiability"])
    paths = {}
    if jax.process_index() == 0:
        paths = evaluate.write_report_set(epath.Path(workdir) / evaluate.EVAL_DIR, split,
                                          evaluation, metadata, splits, pairs,
                                          stem=f"{split}.{stem}")
    return {"metrics": scores, "members": facts, "paths": paths}


def _report(kept: Sequence[Member], evaluation: evaluate.Evaluation, pairs, config: Config,
            splits, which: str | int) -> tuple[list[dict], dict[str, Any], str]:
    """(the members' facts with their metrics, the report's metadata, its stem after the
    split) of ``evaluate_members``: one model's own report, or the ensemble's with each
    member scored alone and its votes added to ``evaluation``'s records."""
    if len(kept) == 1:
        (member,) = kept
        scores = {key: evaluation.scores[key] for key in MEMBER_METRICS}
        facts = [{**member.facts(), "metrics": scores,
                  "story_loss_weight": float(member.config.loss.story_weight)}]
        return (facts, evaluate.report_metadata(member, splits),
                evaluate.checkpoint_name(member))
    member_records, facts = [], []
    for member in kept:
        alone = evaluate.score_predictions(member.predictions, pairs, config.decoding)
        scores = {key: alone.scores[key] for key in MEMBER_METRICS}
        logging.info("member %s (%s-%d): accuracy %.3f consistency %.3f verifiability %.3f",
                     member.folder, member.kind, member.step, scores["accuracy"],
                     scores["consistency"], scores["verifiability"])
        member_records.append(alone.records)
        facts.append({**member.facts(), "metrics": scores,
                      "story_loss_weight": float(member.config.loss.story_weight)})
    names = [m.name for m in kept]
    for n, record in enumerate(evaluation.records):
        record.update(votes(names, [scored_choice(records[n]) for records in member_records]))
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
    return facts, metadata, f"ensemble-{len(kept)}-{which}"


def workdir_name(workdir: str) -> str:
    """A member's name in messages: its folder's name."""
    return epath.Path(workdir).name or str(workdir)
