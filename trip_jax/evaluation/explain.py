"""Readable explanations of one pair's tiered predictions: story, conflicting pair, states.

``explain_pair`` turns one pair's outputs into a JSON-ready dict and ``explanation_text`` into
one line ("Story 1 is plausible. In story 2, sentences 2 and 5 conflict: ...", at most 3 states).
The rules: docs/reference.md#decoding ("Explanations").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trip_jax.data import schema

THRESHOLD = 0.5


def _story_arrays(values: Any, k: int, num_entities: int, num_sentences: int) -> np.ndarray:
    """Story ``k`` of a [2, E, S, ...] array or of a pair of per-story arrays, cut to real rows."""
    array = np.asarray(values[k])
    if array.shape[0] < num_entities or array.shape[1] < num_sentences:
        raise ValueError(f"story {k} predictions have shape {array.shape[:2]}, expected at least "
                         f"({num_entities}, {num_sentences}) for its entities and sentences")
    return array[:num_entities, :num_sentences]


def _states(pred: np.ndarray, entities: Sequence[str], sentence: int, side: str) -> list[dict]:
    """The nontrivial predictions of one side at one sentence, one dict per (entity, attribute)."""
    default = schema.default_values_array()
    found = []
    for e, entity in enumerate(entities):
        for a in np.flatnonzero((pred[e, sentence] != 0) & (pred[e, sentence] != default)):
            attr = schema.ATTRIBUTES[a]
            label = int(pred[e, sentence, a])
            found.append({"entity": entity, "sentence": sentence, "side": side,
                          "attribute": attr, "label": label,
                          "value": schema.label_name(attr, label)})
    return found


def explain_pair(story_pred: int, conflict_prob: Any, pre_pred: Any, eff_pred: Any,
                 entities: Sequence[Sequence[str]],
                 sentences: Sequence[Sequence[str]],
                 backing: dict[str, Any] | None = None) -> dict[str, Any]:
    """Returns a JSON-ready explanation of one pair's predictions (rules in the module docstring).

    Args:
      story_pred: index of the story predicted plausible (0 or 1).
      conflict_prob: beliefs [2, E, S], or one [E_k, S_k] array per story.
      pre_pred, eff_pred: predicted labels [2, E, S, 20], or one [E_k, S_k, 20] array per story.
        Arrays may be padded; they are cut to each story's entities and sentences.
      entities: the entity names of each story; sentences: the sentences of each story.
      backing: coherent decoding's contradiction (``decoding.Contradiction.as_dict``), if any.

    Returns:
      {"plausible_story", "implausible_story", "conflict": {"evidence", "breakpoint",
      "evidence_sentence", "breakpoint_sentence", "beliefs", "detected"}, "states": [{"entity",
      "sentence", "side", "attribute", "label", "value"}], "text"}, and with ``backing``
      "backing": {"entity" (its name), "attribute", "effect_value", "precondition_value", ...}.
    """
    if story_pred not in (0, 1):
        raise ValueError(f"story_pred must be 0 or 1, got {story_pred}")
    k = 1 - int(story_pred)
    names, story = list(entities[k]), list(sentences[k])
    if len(story) < 2:
        raise ValueError(f"story {k} has {len(story)} sentence(s); a conflict needs two")
    probs = _story_arrays(conflict_prob, k, len(names), len(story))
    beliefs = probs.max(axis=0) if names else np.zeros(len(story))
    # Stable sort on negated beliefs: highest first, earlier sentence first among ties.
    i, j = sorted(int(s) for s in np.argsort(-beliefs, kind="stable")[:2])
    states = (_states(_story_arrays(eff_pred, k, len(names), len(story)), names, i, "effect")
              + _states(_story_arrays(pre_pred, k, len(names), len(story)), names, j,
                        "precondition"))
    explanation = {
        "plausible_story": int(story_pred),
        "implausible_story": k,
        "conflict": {
            "evidence": i, "breakpoint": j,
            "evidence_sentence": story[i], "breakpoint_sentence": story[j],
            "beliefs": [float(beliefs[i]), float(beliefs[j])],
            "detected": bool(beliefs[i] >= THRESHOLD and beliefs[j] >= THRESHOLD),
        },
        "states": states,
    }
    if backing is not None:
        if backing["story"] != k or (backing["evidence"], backing["breakpoint"]) != (i, j):
            raise ValueError(f"the backing contradiction {backing} is not the decoded conflict "
                             f"(story {k}, sentences {i} and {j})")
        explanation["backing"] = {**backing, "entity": names[backing["entity"]]}
    explanation["text"] = explanation_text(explanation)
    return explanation


def _mention(entity: str) -> str:
    """'the phone' for objects; names (capitalised, as the data writes humans) stay bare."""
    return entity if entity[:1].isupper() else f"the {entity}"


def _join(words: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


# The most states the one-line text names (the JSON's "states" and the explorer page list all).
TEXT_STATES = 3


def _backs(state: dict, backing: dict[str, Any] | None) -> bool:
    """Whether ``state`` is one of the backing contradiction's two states."""
    return bool(backing) and (state["entity"], state["attribute"]) == (backing["entity"],
                                                                       backing["attribute"])


def _text_states(explanation: dict[str, Any]) -> list[dict]:
    """The states the text names besides the backing contradiction (which takes two of the
    TEXT_STATES): first an entity and attribute whose effect at i and precondition at j
    disagree, then an entity with states on both sides, then the rest, each in the JSON's
    order."""
    backing = explanation.get("backing")
    states = [s for s in explanation["states"] if not _backs(s, backing)]
    values: dict[tuple[str, str], set] = {}
    for state in states:
        values.setdefault((state["entity"], state["attribute"]), set()).add(state["value"])
    both = {s["entity"] for s in states if s["side"] == "effect"} & {
        s["entity"] for s in states if s["side"] == "precondition"}

    def rank(state: dict) -> int:
        if len(values[(state["entity"], state["attribute"])]) > 1:
            return 0
        return 1 if state["entity"] in both else 2

    return sorted(states, key=rank)[:TEXT_STATES - (2 if backing else 0)]


def explanation_text(explanation: dict[str, Any]) -> str:
    """Returns an ``explain_pair`` dict in one line (1-based sentence numbers): the plausible
    story, the conflicting sentences and at most TEXT_STATES states, the backing contradiction's
    first (``_text_states``); the number of the states left out."""
    c = explanation["conflict"]
    i, j = c["evidence"] + 1, c["breakpoint"] + 1
    head = (f"Story {explanation['plausible_story'] + 1} is plausible. "
            f"In story {explanation['implausible_story'] + 1}, sentences {i} and {j} conflict")
    if not c["detected"]:
        head += " (weakly: the model's belief is below 0.5)"
    backing = explanation.get("backing")
    chosen = _text_states(explanation)
    if not chosen and not backing:
        return head + "; no predicted physical state supports it."
    clauses = []
    if backing:
        clauses.append(f"after sentence {i} {_mention(backing['entity'])} is "
                       f"{backing['effect_value']}, but sentence {j} needs it "
                       f"{backing['precondition_value']}")
    by_entity: dict[tuple[str, str], list[str]] = {}
    for state in chosen:
        by_entity.setdefault((state["side"], state["entity"]), []).append(state["value"])
    clauses += [f"after sentence {i} {_mention(entity)} is {_join(values)}"
                for (side, entity), values in by_entity.items() if side == "effect"]
    clauses += [f"sentence {j} needs {_mention(entity)} to be {_join(values)}"
                for (side, entity), values in by_entity.items() if side == "precondition"]
    more = sum(not _backs(s, backing) for s in explanation["states"]) - len(chosen)
    rest = f" ({more} more predicted state{'s' if more > 1 else ''})" if more > 0 else ""
    return head + ": " + "; ".join(clauses) + rest + "."


def deciding_states(implausible: int, gold_conflict: Sequence[int], pre_label: Any,
                    pre_pred: Any, eff_label: Any, eff_pred: Any,
                    entities: Sequence[str], num_sentences: int) -> list[dict[str, Any]]:
    """The states that decide verifiability, gold against predicted, for every entity.

    In the gold implausible story ``implausible`` with its gold conflict (i, j) =
    ``gold_conflict``: the effects at i and the preconditions at j where the gold label or the
    prediction is nontrivial (non-zero, not the attribute's default). ``*_label`` / ``*_pred``
    are [2, E, S, 20] (or one [E_k, S_k, 20] array per story; padding allowed); ``entities``
    are story ``implausible``'s names. One dict per (entity, side, attribute): "entity",
    "side", "sentence", "attribute", "gold", "predicted" (labels), "gold_value",
    "predicted_value" (words), "counted" (the prediction is nontrivial, so the verifiability
    metric checks it) and "wrong" (counted and not the gold label). Empty when the gold conflict
    is not a pair. The metric's ``states_correct`` is: some row counted and none wrong.
    """
    if len(gold_conflict) != 2:
        return []
    i, j = (int(s) for s in gold_conflict)
    default = schema.default_values_array()
    rows = []
    for side, sentence, gold, pred in (("effect", i, eff_label, eff_pred),
                                       ("precondition", j, pre_label, pre_pred)):
        g = _story_arrays(gold, implausible, len(entities), num_sentences)[:, sentence]
        p = _story_arrays(pred, implausible, len(entities), num_sentences)[:, sentence]
        for e, entity in enumerate(entities):
            counted = (p[e] != 0) & (p[e] != default)
            for a in np.flatnonzero(((g[e] != 0) & (g[e] != default)) | counted):
                attr = schema.ATTRIBUTES[a]
                gold_label, pred_label = int(g[e, a]), int(p[e, a])
                rows.append({"entity": entity, "side": side, "sentence": sentence,
                             "attribute": attr, "gold": gold_label, "predicted": pred_label,
                             "gold_value": schema.label_name(attr, gold_label),
                             "predicted_value": schema.label_name(attr, pred_label),
                             "counted": bool(counted[a]),
                             "wrong": bool(counted[a] and pred_label != gold_label)})
    return rows
