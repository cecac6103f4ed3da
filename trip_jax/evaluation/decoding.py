"""Reading the model's outputs as a prediction: independent decoding and coherent decoding.

Pure numpy. ``decode(arrays, config)`` takes the eval step's outputs of N pairs and returns what
the metrics score: ``story_pred``, ``conflict_prob``, ``pre_pred`` and ``eff_pred``.
Every rule and its reasons: docs/reference.md#decoding.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trip_jax.data import batch_contract, schema
from trip_jax.config.sections import DecodingConfig, DecodingMethod, choices_of

DECODINGS: tuple[str, ...] = choices_of(DecodingMethod)  # decoding.method
# Decodings that choose the story by the model's story logits (-sum of conflict beliefs / 2),
# which only the story loss trains for that purpose: untrained under a story loss weight of 0.
READS_STORY_LOGITS: tuple[str, ...] = ("independent",)
# int [N, 2, E]: each entity's alias group (``alias_groups``), added by the evaluator; read by
# coherent decoding with ``alias_states``.
ALIAS_KEY = "entity_alias"
FALSE, TRUE = 1, 2  # class indices of a binary attribute (0 is "unknown")
# Binary attributes: 3 classes and not a location; candidates of a contradiction.
BINARY_ATTRIBUTES: np.ndarray = np.asarray(
    [a for a, name in enumerate(schema.ATTRIBUTES)
     if name not in schema.LOCATION_ATTRIBUTES and schema.NUM_CLASSES[a] == 3])
# Contradiction directions: (effect class at i, precondition class at j).
DIRECTIONS: tuple[tuple[int, int], ...] = ((FALSE, TRUE), (TRUE, FALSE))


@dataclasses.dataclass(frozen=True)
class Contradiction:
    """A backed contradiction: story k, entity e, attribute a, sentences i < j, with the effect
    class at i, the precondition class at j and its log-probability."""

    story: int
    entity: int
    attribute: int
    evidence: int
    breakpoint: int
    effect: int
    precondition: int
    log_prob: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with the attribute's name and the two values in words."""
        name = schema.ATTRIBUTES[self.attribute]
        return {"story": self.story, "entity": self.entity, "attribute": name,
                "evidence": self.evidence, "breakpoint": self.breakpoint,
                "effect": self.effect, "effect_value": schema.label_name(name, self.effect),
                "precondition": self.precondition,
                "precondition_value": schema.label_name(name, self.precondition),
                "log_prob": self.log_prob}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis (classes beyond an attribute's count hold a large negative
    logit, so they get probability 0)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


def contradiction_log_probs(pre: np.ndarray, eff: np.ndarray,
                         conflict_logits: np.ndarray, row_mask: np.ndarray,
                         config: DecodingConfig) -> np.ndarray:
    """Log-probabilities of every candidate contradiction of one story.

    ``pre``/``eff`` [E, S, B, C] log-probabilities of the ``BINARY_ATTRIBUTES``,
    ``conflict_logits`` [E, S], ``row_mask`` bool [E, S]. Returns [E, S(i), S(j),
    len(BINARY_ATTRIBUTES), 2 directions], -inf where i >= j or either row is padding.
    """
    eff_v = np.stack([eff[..., v] for v, _ in DIRECTIONS], axis=-1)  # [E, S, B, 2]
    pre_w = np.stack([pre[..., w] for _, w in DIRECTIONS], axis=-1)
    log_prob = eff_v[:, :, None] + pre_w[:, None, :]  # [E, i, j, B, 2]
    if config.persistence:
        # log(1 - P(eff_m = w)): sentence m does not set the attribute to the later value.
        undo = np.stack([np.exp(eff[..., w]) for _, w in DIRECTIONS], axis=-1)
        keep = np.log(np.clip(1.0 - undo, 1e-12, None))
        cumulative = np.cumsum(keep, axis=1)  # [E, m, B, 2]: sum over sentences 0..m
        # sum over i < m < j = cumulative[j - 1] - cumulative[i] (0 when j = i + 1)
        before_j = np.concatenate([np.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], axis=1)
        between = before_j[:, None, :] - cumulative[:, :, None]
        log_prob = log_prob + between
    if config.detector_weight:
        belief = _log_sigmoid(conflict_logits)  # [E, S]
        log_prob = log_prob + config.detector_weight * (
            belief[:, :, None] + belief[:, None, :])[..., None, None]
    num_sentences = row_mask.shape[1]
    later = np.triu(np.ones((num_sentences, num_sentences), bool), k=1)  # [i, j]: i < j
    valid = later[None] & row_mask[:, :, None] & row_mask[:, None, :]
    return np.where(valid[..., None, None], log_prob, -np.inf)


def story_evidence(log_probs: np.ndarray) -> float:
    """log of the summed probability of a story's backed contradictions (``contradiction_log_probs``
    of the story); -inf when it has none."""
    finite = log_probs[np.isfinite(log_probs)]
    if not finite.size:
        return -np.inf
    top = finite.max()
    return float(top + np.log(np.exp(finite - top).sum()))


def best_contradiction(log_probs: np.ndarray, story: int) -> Contradiction | None:
    """The first most probable candidate of ``contradiction_log_probs`` (C order: entity, i, j,
    attribute, direction); None when the story has none."""
    flat = int(np.argmax(log_probs))
    log_prob = float(log_probs.flat[flat])
    if not np.isfinite(log_prob):
        return None
    e, i, j, b, d = np.unravel_index(flat, log_probs.shape)
    effect, precondition = DIRECTIONS[int(d)]
    return Contradiction(story=story, entity=int(e), attribute=int(BINARY_ATTRIBUTES[b]),
                         evidence=int(i), breakpoint=int(j), effect=effect,
                         precondition=precondition, log_prob=log_prob)


def coherent_pair(outputs: Mapping[str, np.ndarray], config: DecodingConfig
                  ) -> tuple[int, Contradiction | None]:
    """Decodes one pair (arrays [2, E, S, ...] without the pair axis): returns the plausible
    story and the implausible story's best backed contradiction (module docstring)."""
    mask = np.asarray(outputs["row_mask"], bool)
    # Only the binary attributes can back a contradiction.
    pre, eff = (log_softmax(np.asarray(outputs[key])[..., BINARY_ATTRIBUTES, :])
                for key in ("pre_logits", "eff_logits"))
    log_probs = [contradiction_log_probs(pre[k], eff[k], outputs["conflict_logits"][k], mask[k],
                                         config) for k in (0, 1)]
    evidence = [story_evidence(s) for s in log_probs]
    if evidence[0] == evidence[1]:
        plausible = int(outputs["story_pred"])
    else:
        plausible = int(evidence[0] > evidence[1])  # the implausible story has more evidence
    return plausible, best_contradiction(log_probs[1 - plausible], 1 - plausible)


def alias_groups(names: Sequence[str]) -> np.ndarray:
    """Each entity's alias group, int [len(names)]: names linked by containment (one inside the
    other, case-insensitive; "TV" and "John's TV"), transitively, share the group of their
    smallest index."""
    lowered = [name.strip().lower() for name in names]
    group = np.arange(len(names))
    for a, b in itertools.combinations(range(len(names)), 2):
        if lowered[a] and lowered[b] and (lowered[a] in lowered[b] or lowered[b] in lowered[a]):
            group[group == max(group[a], group[b])] = min(group[a], group[b])
    return group


def alias_array(stories: Sequence[Sequence[Sequence[str]]], entities: int) -> np.ndarray:
    """``ALIAS_KEY`` of N pairs: ``stories[n][k]`` the entity names of story k of pair n; int
    [N, 2, entities], padding rows in groups of their own."""
    out = np.tile(np.arange(entities), (len(stories), 2, 1))
    for n, pair in enumerate(stories):
        for k, names in enumerate(pair):
            out[n, k, :len(names)] = alias_groups(names)
    return out


def read_states(pred: np.ndarray, logits: np.ndarray, alias: np.ndarray | None,
                config: DecodingConfig) -> np.ndarray:
    """One pair's states under ``state_threshold`` and ``alias_states`` (module docstring):
    ``pred`` int [2, E, S, 20] argmax states, ``logits`` [2, E, S, 20, C], ``alias`` int [2, E]
    (``alias_groups`` of each story; needed with ``alias_states``)."""
    pred = np.array(pred)
    if not config.state_threshold and not config.alias_states:
        return pred
    confidence = np.take_along_axis(log_softmax(logits), pred[..., None], -1)[..., 0]
    if config.state_threshold:
        pred[confidence < np.log(config.state_threshold)] = 0
    if config.alias_states:
        nontrivial = (pred != 0) & (pred != schema.default_values_array())
        confidence = np.where(nontrivial, confidence, -np.inf)
        for k in range(pred.shape[0]):
            for group in np.unique(alias[k]):
                members = np.flatnonzero(alias[k] == group)
                if len(members) < 2:
                    continue
                # At each (sentence, attribute) the most probable name keeps its state.
                keep = members[np.argmax(confidence[k, members], axis=0)]  # [S, 20]
                drop = nontrivial[k, members] & (members[:, None, None] != keep[None])
                pred[k, members] = np.where(drop, 0, pred[k, members])
    return pred


def apply_contradiction(pre_pred: np.ndarray, eff_pred: np.ndarray, row_mask: np.ndarray,
                        found: Contradiction | None, *, pre_logits: np.ndarray | None = None,
                        eff_logits: np.ndarray | None = None,
                        config: DecodingConfig = DecodingConfig()
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pair's decoded states and beliefs ([2, E, S, ...]): the states (``read_states``) with
    the backing cells set, and beliefs 1 at i and j of the contradiction's story for every entity
    with a non-zero decoded state there (module docstring). ``conflict_state_threshold`` (module
    docstring) reads the logits [2, E, S, 20, C]."""
    pre_pred, eff_pred = np.array(pre_pred), np.array(eff_pred)
    beliefs = np.zeros(row_mask.shape, np.float32)
    if found is None:
        return pre_pred, eff_pred, beliefs
    k, e, a = found.story, found.entity, found.attribute
    cells = ((eff_pred, eff_logits, found.evidence, found.effect),
             (pre_pred, pre_logits, found.breakpoint, found.precondition))
    if config.conflict_state_threshold:
        for pred, logits, s, _ in cells:
            # The explanation's states (story k, sentence s, every entity) need more belief.
            confidence = np.take_along_axis(log_softmax(logits[k, :, s]),
                                            pred[k, :, s, :, None], -1)[..., 0]
            pred[k, :, s][confidence < np.log(config.conflict_state_threshold)] = 0
    if backs(found, config):
        for pred, _, s, value in cells:
            pred[k, e, s, a] = value
    for s in (found.evidence, found.breakpoint):
        involved = (pre_pred[k, :, s] != 0).any(-1) | (eff_pred[k, :, s] != 0).any(-1)
        beliefs[k, :, s] = (involved | (np.arange(len(involved)) == e)) & row_mask[k, :, s]
    return pre_pred, eff_pred, beliefs


def backs(found: Contradiction, config: DecodingConfig) -> bool:
    """Whether the contradiction's two states are written into the decoded states: its
    probability is at least ``min_flip_probability``."""
    if not config.min_flip_probability:
        return True
    return found.log_prob >= np.log(config.min_flip_probability)


@dataclasses.dataclass
class Decoded:
    """The predictions of N pairs under one decoding; ``contradictions`` holds each pair's
    backing contradiction (coherent decoding; None where a story had none, and in independent
    decoding)."""

    story_pred: np.ndarray
    conflict_prob: np.ndarray
    pre_pred: np.ndarray
    eff_pred: np.ndarray
    contradictions: list[Contradiction | None]

    def predictions(self) -> dict[str, np.ndarray]:
        """The four prediction arrays by their batch-contract names."""
        return {"story_pred": self.story_pred, "conflict_prob": self.conflict_prob,
                "pre_pred": self.pre_pred, "eff_pred": self.eff_pred}


def decode(arrays: Mapping[str, np.ndarray], config: DecodingConfig) -> Decoded:
    """Decodes N pairs' eval-step outputs (pair axis first; the model's own predictions, the
    ``batch_contract.LOGIT_KEYS`` for coherent decoding, and ``row_mask``) with
    ``config.method``."""
    if config.method == "independent":
        return Decoded(np.asarray(arrays["story_pred"]), np.asarray(arrays["conflict_prob"]),
                       np.asarray(arrays["pre_pred"]), np.asarray(arrays["eff_pred"]),
                       [None] * len(arrays["story_pred"]))
    missing = [k for k in (*batch_contract.LOGIT_KEYS, "row_mask") if k not in arrays]
    if missing:
        raise KeyError(f"coherent decoding needs the eval step's {missing}")
    if config.alias_states and ALIAS_KEY not in arrays:
        raise KeyError(f"decoding.alias_states needs {ALIAS_KEY!r} (the evaluator adds it)")
    story, beliefs, pres, effs, found_all = [], [], [], [], []
    keys = (*batch_contract.LOGIT_KEYS, "row_mask", "story_pred")
    for n in range(len(arrays["story_pred"])):
        pair = {k: np.asarray(arrays[k][n]) for k in keys}
        plausible, found = coherent_pair(pair, config)
        alias = np.asarray(arrays[ALIAS_KEY][n]) if config.alias_states else None
        pre, eff, belief = apply_contradiction(
            read_states(arrays["pre_pred"][n], pair["pre_logits"], alias, config),
            read_states(arrays["eff_pred"][n], pair["eff_logits"], alias, config),
            pair["row_mask"], found, pre_logits=pair["pre_logits"],
            eff_logits=pair["eff_logits"], config=config)
        story.append(plausible)
        beliefs.append(belief)
        pres.append(pre)
        effs.append(eff)
        found_all.append(found if found is not None and backs(found, config) else None)
    return Decoded(np.asarray(story, np.int64), np.stack(beliefs), np.stack(pres),
                   np.stack(effs), found_all)
