"""TRIP's tiered metrics in pure numpy: accuracy, consistency, verifiability, F1s.

Inputs (``TieredArrays``): the batch contract's arrays, pair axis first, padded, with ``mask``
marking real rows (callers drop padding pairs first). Every clause, the F1s and the failure
modes: docs/reference.md#metrics.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from trip_jax.data import schema

THRESHOLD = 0.5
# The three tiers, in the paper's order (reported per decoding and summarised over runs).
TIER_METRICS: tuple[str, ...] = ("accuracy", "consistency", "verifiability")
# The scalar entries of ``tiered_metrics``: logged, kept in checkpoint metadata, averaged with
# their spread by the random baseline.
SCALAR_METRICS: tuple[str, ...] = (*TIER_METRICS, "precondition_f1", "effect_f1", "conflict_f1",
                                   "conflict_f1_positive")


@dataclasses.dataclass(frozen=True)
class TieredArrays:
    """Gold labels and predictions of N pairs, the inputs of every metric function.

    story_label, story_pred: int [N], index of the plausible story (gold / predicted).
    conflict_label: {0, 1} [N, 2, E, S]; conflict_prob: float [N, 2, E, S] beliefs (>= 0.5
    counts as a predicted conflicting sentence).
    pre_label, pre_pred, eff_label, eff_pred: int [N, 2, E, S, 20] state labels/predictions.
    mask: bool [N, 2, E, S] real (entity, sentence) rows, or None when every row is real.
    """

    story_label: Any
    story_pred: Any
    conflict_label: Any
    conflict_prob: Any
    pre_label: Any
    pre_pred: Any
    eff_label: Any
    eff_pred: Any
    mask: Any = None

    @classmethod
    def from_mapping(cls, arrays: Mapping[str, Any]) -> "TieredArrays":
        """From a mapping with the batch contract's names (labels, predictions, ``row_mask``);
        other keys are ignored."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "mask"]
        return cls(**{name: arrays[name] for name in names}, mask=arrays.get("row_mask"))


def _as_arrays(x: TieredArrays) -> dict[str, np.ndarray]:
    """Converts and checks the inputs of the metric functions; returns them in a dict."""
    if not isinstance(x, TieredArrays):
        raise TypeError(f"expected metrics.TieredArrays, got {type(x).__name__}")
    mask = x.mask
    a = {
        "story_label": np.asarray(x.story_label, dtype=np.int64),
        "story_pred": np.asarray(x.story_pred, dtype=np.int64),
        "conflict_label": np.asarray(x.conflict_label) != 0,
        "conflict_prob": np.asarray(x.conflict_prob, dtype=np.float64),
        "pre_label": np.asarray(x.pre_label, dtype=np.int64),
        "pre_pred": np.asarray(x.pre_pred, dtype=np.int64),
        "eff_label": np.asarray(x.eff_label, dtype=np.int64),
        "eff_pred": np.asarray(x.eff_pred, dtype=np.int64),
    }
    rows = a["conflict_label"].shape
    if len(rows) != 4 or rows[1] != 2:
        raise ValueError(f"conflict_label must be [N, 2, E, S], got shape {rows}")
    n = rows[0]
    if n == 0:
        raise ValueError("no pairs to score")
    a["mask"] = np.ones(rows, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    for key in ("story_label", "story_pred"):
        if a[key].shape != (n,):
            raise ValueError(f"{key} must be [{n}], got shape {a[key].shape}")
    if not np.isin(a["story_label"], (0, 1)).all() or not np.isin(a["story_pred"], (0, 1)).all():
        raise ValueError("story_label and story_pred must hold 0 or 1")
    for key in ("conflict_prob", "mask"):
        if a[key].shape != rows:
            raise ValueError(f"{key} must have shape {rows}, got {a[key].shape}")
    for key in ("pre_label", "pre_pred", "eff_label", "eff_pred"):
        if a[key].shape != rows + (schema.NUM_ATTRIBUTES,):
            raise ValueError(f"{key} must have shape {rows + (schema.NUM_ATTRIBUTES,)}, "
                             f"got {a[key].shape}")
        if a[key].size and (a[key].min() < 0 or (a[key] >= schema.num_classes_array()).any()):
            raise ValueError(f"{key} holds a label outside its attribute's classes")
    return a


def _pair_outcomes(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-pair booleans and conflict sets from checked arrays (see ``pair_outcomes``)."""
    mask = a["mask"]
    n = mask.shape[0]
    pred_sentences = ((a["conflict_prob"] >= THRESHOLD) & mask).any(axis=(1, 2))  # [N, S]
    gold_sentences = (a["conflict_label"] & mask).any(axis=(1, 2))
    gold_is_pair = gold_sentences.sum(axis=-1) == 2
    conflict_correct = gold_is_pair & (pred_sentences == gold_sentences).all(axis=-1)

    # Evidence i = first gold sentence, breakpoint j = last; only meaningful where gold_is_pair.
    s = gold_sentences.shape[-1]
    i = np.argmax(gold_sentences, axis=-1)
    j = s - 1 - np.argmax(gold_sentences[:, ::-1], axis=-1)
    ar = np.arange(n)
    k = 1 - a["story_label"]
    default = schema.default_values_array()

    def side(pred, label, sentence):
        # [N, E, 20] predictions of story k at one sentence per pair, with their real-row mask;
        # returns (any nontrivial prediction [N], attributes with a wrong one [N, 20]).
        p = pred[ar, k, :, sentence]
        nontrivial = (p != 0) & (p != default) & mask[ar, k, :, sentence][..., None]
        wrong = nontrivial & (p != label[ar, k, :, sentence])
        return nontrivial.any(axis=(1, 2)), wrong.any(axis=1)

    found_eff, wrong_eff = side(a["eff_pred"], a["eff_label"], i)
    found_pre, wrong_pre = side(a["pre_pred"], a["pre_label"], j)
    states_found = found_eff | found_pre
    states_correct = gold_is_pair & states_found & ~(wrong_eff | wrong_pre).any(axis=-1)

    correct = a["story_pred"] == a["story_label"]
    consistent = correct & conflict_correct
    return {
        "correct": correct,
        "conflict_correct": conflict_correct,
        "states_correct": states_correct,
        "consistent": consistent,
        "verifiable": consistent & states_correct,
        "predicted_sentences": pred_sentences,
        "gold_sentences": gold_sentences,
        "states_found": states_found,
        "wrong_effect_attributes": wrong_eff,
        "wrong_precondition_attributes": wrong_pre,
    }


def pair_outcomes(arrays: TieredArrays) -> dict[str, np.ndarray]:
    """Returns the per-pair results behind the metrics, for predictions files and analyses.

    Same argument as ``tiered_metrics``. Keys: ``correct``, ``conflict_correct``,
    ``states_correct``, ``consistent``, ``verifiable`` (bool [N]); ``predicted_sentences``,
    ``gold_sentences`` (bool [N, S]: the predicted and gold conflict sets); ``states_found``
    (bool [N]: story k has a nontrivial prediction among the effects at i and preconditions at
    j); ``wrong_effect_attributes``, ``wrong_precondition_attributes`` (bool [N, 20]: the
    attributes with a wrong nontrivial prediction there). ``outcome_record`` turns one pair of it
    into a JSON-ready dict.
    """
    return _pair_outcomes(_as_arrays(arrays))


def outcome_record(outcomes: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """Returns pair ``n`` of ``pair_outcomes(...)`` as plain Python values (JSON-ready)."""
    record: dict[str, Any] = {key: bool(outcomes[key][n]) for key in (
        "correct", "consistent", "verifiable", "conflict_correct", "states_correct")}
    for key, source in (("predicted_conflict", "predicted_sentences"),
                        ("gold_conflict", "gold_sentences")):
        record[key] = [int(s) for s in np.flatnonzero(outcomes[source][n])]
    return record


def _macro_f1(true: np.ndarray, pred: np.ndarray, num_classes: int) -> float:
    """Macro-F1 over the classes present in ``true`` or ``pred`` (nan when both are empty)."""
    if true.size == 0:
        return float("nan")
    confusion = np.bincount(true * num_classes + pred, minlength=num_classes * num_classes)
    confusion = confusion.reshape(num_classes, num_classes)
    tp = np.diag(confusion)
    gold = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    present = (gold + predicted) > 0
    return float(np.mean(2 * tp[present] / (gold[present] + predicted[present])))


def _binary_f1(true: np.ndarray, pred: np.ndarray) -> float:
    """F1 of the positive class (0 when there are neither gold nor predicted positives)."""
    tp = np.sum(true & pred)
    denominator = np.sum(true) + np.sum(pred)
    return float(2 * tp / denominator) if denominator else 0.0


def _state_f1(label: np.ndarray, pred: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Per-attribute macro-F1 of one side (preconditions or effects) over real rows."""
    true_rows, pred_rows = label[mask], pred[mask]  # [R, 20]
    return {attr: _macro_f1(true_rows[:, a], pred_rows[:, a], schema.NUM_CLASSES[a])
            for a, attr in enumerate(schema.ATTRIBUTES)}


def _failure_modes(outcomes: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Counts and fractions of the 8 story x conflict x states right/wrong cells (Figure 3)."""
    n = outcomes["correct"].shape[0]
    modes = []
    for story, conflict, states in itertools.product((True, False), repeat=3):
        count = int(np.sum((outcomes["correct"] == story)
                           & (outcomes["conflict_correct"] == conflict)
                           & (outcomes["states_correct"] == states)))
        modes.append({"story": story, "conflict": conflict, "states": states,
                      "count": count, "fraction": count / n})
    return modes


def _tier_losses(outcomes: dict[str, np.ndarray]) -> dict[str, Any]:
    """Where pairs are lost, tier by tier (shares of all pairs that sum to 1): the story is wrong;
    the story is right but the conflict is not; consistent but the states are not right; and
    verifiable. For the consistent-but-not-verifiable pairs: how many had no nontrivial state
    prediction at all, and per attribute how many had a wrong effect at i / precondition at j."""
    correct, consistent = outcomes["correct"], outcomes["consistent"]
    verifiable = outcomes["verifiable"]
    unverified = consistent & ~verifiable
    return {
        "shares": {"story": float(np.mean(~correct)),
                   "conflict": float(np.mean(correct & ~consistent)),
                   "states": float(np.mean(unverified)),
                   "verifiable": float(np.mean(verifiable))},
        "unverified_pairs": int(unverified.sum()),
        "unverified_without_states": int((unverified & ~outcomes["states_found"]).sum()),
        "unverified_wrong_attributes": {
            attr: {"effect": int(outcomes["wrong_effect_attributes"][unverified, x].sum()),
                   "precondition": int(
                       outcomes["wrong_precondition_attributes"][unverified, x].sum())}
            for x, attr in enumerate(schema.ATTRIBUTES)},
    }


def _state_contribution(a: dict[str, np.ndarray], outcomes: dict[str, np.ndarray],
                        pre_f1: dict[str, float], eff_f1: dict[str, float]) -> dict[str, dict]:
    """Per attribute: nontrivial correct predictions, share in detected conflicts (Figure 5)."""
    mask = a["mask"]
    n, s = mask.shape[0], mask.shape[-1]
    # Rows that sit in a correctly detected conflict: consistent pair, story k, sentence i or j.
    in_conflict = np.zeros((n, 2, s), dtype=bool)
    k = 1 - a["story_label"]
    in_conflict[np.arange(n), k] = outcomes["consistent"][:, None] & outcomes["gold_sentences"]
    in_conflict = np.broadcast_to(in_conflict[:, :, None, :], mask.shape)
    default = schema.default_values_array()
    correct = np.zeros(schema.NUM_ATTRIBUTES, dtype=np.int64)
    supporting = np.zeros(schema.NUM_ATTRIBUTES, dtype=np.int64)
    for side in ("pre", "eff"):
        pred = a[f"{side}_pred"]
        hit = (pred == a[f"{side}_label"]) & (pred != 0) & (pred != default) & mask[..., None]
        correct += hit.sum(axis=(0, 1, 2, 3))
        supporting += (hit & in_conflict[..., None]).sum(axis=(0, 1, 2, 3))
    return {
        attr: {
            "correct": int(correct[x]),
            "in_detected_conflicts": int(supporting[x]),
            "share": float(supporting[x] / correct[x]) if correct[x] else float("nan"),
            "f1": (pre_f1[attr] + eff_f1[attr]) / 2,
        }
        for x, attr in enumerate(schema.ATTRIBUTES)
    }


def tiered_metrics(arrays: TieredArrays) -> dict[str, Any]:
    """Scores tiered predictions with TRIP's metrics (definitions in the module docstring); the
    metrics of ``scored_pairs``."""
    return scored_pairs(arrays)[0]


def scored_pairs(arrays: TieredArrays) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Scores tiered predictions with TRIP's metrics and returns (metrics, ``pair_outcomes``),
    both from one pass over the arrays.

    Args:
      arrays: the gold labels and predictions of N pairs (``TieredArrays``).

    Returns:
      (metrics, outcomes). metrics: ``num_pairs``; ``accuracy``, ``consistency``,
      ``verifiability`` (fractions); ``precondition_f1``, ``effect_f1`` (macro, averaged over attributes) and
      ``precondition_f1_per_attribute``, ``effect_f1_per_attribute`` ({attribute: F1});
      ``conflict_f1``, ``conflict_f1_positive``; ``failure_modes`` (8 dicts with ``story``,
      ``conflict``, ``states`` booleans, ``count``, ``fraction``); ``tier_losses`` (where pairs
      are lost tier by tier, and the wrong attributes of consistent-but-not-verifiable pairs:
      ``_tier_losses``); ``state_contribution``
      ({attribute: {correct, in_detected_conflicts, share, f1}}). outcomes: the per-pair
      results (``pair_outcomes``).
    """
    a = _as_arrays(arrays)
    outcomes = _pair_outcomes(a)
    mask = a["mask"]
    pre_f1 = _state_f1(a["pre_label"], a["pre_pred"], mask)
    eff_f1 = _state_f1(a["eff_label"], a["eff_pred"], mask)
    conflict_true = a["conflict_label"][mask]
    conflict_pred = a["conflict_prob"][mask] >= THRESHOLD
    scores = {
        "num_pairs": int(mask.shape[0]),
        "accuracy": float(outcomes["correct"].mean()),
        "consistency": float(outcomes["consistent"].mean()),
        "verifiability": float(outcomes["verifiable"].mean()),
        "precondition_f1": float(np.nanmean(list(pre_f1.values()))) if mask.any() else float("nan"),
        "effect_f1": float(np.nanmean(list(eff_f1.values()))) if mask.any() else float("nan"),
        "precondition_f1_per_attribute": pre_f1,
        "effect_f1_per_attribute": eff_f1,
        "conflict_f1": _macro_f1(conflict_true.astype(np.int64), conflict_pred.astype(np.int64), 2),
        "conflict_f1_positive": _binary_f1(conflict_true, conflict_pred),
        "failure_modes": _failure_modes(outcomes),
        "tier_losses": _tier_losses(outcomes),
        "state_contribution": _state_contribution(a, outcomes, pre_f1, eff_f1),
    }
    return scores, outcomes
