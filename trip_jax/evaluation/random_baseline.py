"""The random tiered baseline of Tables 2-3: random predictions at every tier, averaged over seeds.

Schemes ``"tiered"`` (the default) and ``"reference"`` (the authors' notebook), both scored by
``metrics.tiered_metrics``; ``--mode=random_baseline`` prints ``summary`` and writes the report.
Details: docs/reference.md#metrics; scores: docs/results.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trip_jax.data import schema
from trip_jax.evaluation import metrics
from trip_jax.data.labels import conflict_labels
from trip_jax.data.types import StoryPair

SCHEMES = ("tiered", "reference")
SEEDS = 10


def label_arrays(pairs: Sequence[StoryPair]) -> dict[str, np.ndarray]:
    """Stacks the gold labels of typed pairs into padded arrays for ``tiered_metrics``.

    Returns ``story_label`` [N], ``conflict_label`` [N, 2, E, S], ``pre_label`` and ``eff_label``
    [N, 2, E, S, 20] and ``mask`` [N, 2, E, S], with E and S the largest entity and sentence counts
    of any story (padding is zero and masked out).
    """
    if not pairs:
        raise ValueError("no pairs given")
    stories = [story for pair in pairs for story in pair.stories]
    e = max(max(story.num_entities for story in stories), 1)
    s = max(story.num_sentences for story in stories)
    n = len(pairs)
    out = {
        "story_label": np.asarray([pair.label for pair in pairs], dtype=np.int32),
        "conflict_label": np.zeros((n, 2, e, s), dtype=np.int32),
        "pre_label": np.zeros((n, 2, e, s, schema.NUM_ATTRIBUTES), dtype=np.int32),
        "eff_label": np.zeros((n, 2, e, s, schema.NUM_ATTRIBUTES), dtype=np.int32),
        "mask": np.zeros((n, 2, e, s), dtype=bool),
    }
    for x, pair in enumerate(pairs):
        for k, story in enumerate(pair.stories):
            ne, ns = story.num_entities, story.num_sentences
            states = story.states[:ne, :ns]
            out["pre_label"][x, k, :ne, :ns] = states[..., 0, :]
            out["eff_label"][x, k, :ne, :ns] = states[..., 1, :]
            out["conflict_label"][x, k, :ne, :ns] = conflict_labels(story)
            out["mask"][x, k, :ne, :ns] = True
    return out


def random_predictions(labels: dict[str, np.ndarray], rng: np.random.Generator,
                       scheme: str = "tiered") -> dict[str, np.ndarray]:
    """Draws one set of random tiered predictions for ``label_arrays(...)`` (module docstring).

    Returns ``story_pred`` [N], ``conflict_prob`` [N, 2, E, S] (0 or 1), ``pre_pred`` and
    ``eff_pred`` [N, 2, E, S, 20] (0 on padded rows).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    mask = labels["mask"]
    n = mask.shape[0]
    num_classes = schema.num_classes_array()
    story_pred = rng.integers(0, 2, size=n)
    states = {}
    for side in ("pre_pred", "eff_pred"):
        draw = np.floor(rng.random(mask.shape + (schema.NUM_ATTRIBUTES,)) * num_classes)
        states[side] = (draw.astype(np.int32) * mask[..., None]).astype(np.int32)

    conflict_prob = np.zeros(mask.shape, dtype=np.float32)
    for x in range(n):
        if scheme == "tiered":
            k = 1 - story_pred[x]
            entities = np.flatnonzero(mask[x, k].any(axis=1))
            chosen = [rng.choice(entities)] if entities.size else []
        else:
            k = 1 - labels["story_label"][x]
            chosen = np.flatnonzero(mask[x, k].any(axis=1))
        sentences = np.flatnonzero(mask[x, k].any(axis=0))
        if sentences.size < 2:
            continue
        for entity in chosen:
            conflict_prob[x, k, entity, rng.choice(sentences, size=2, replace=False)] = 1.0
    return {"story_pred": story_pred, "conflict_prob": conflict_prob, **states}


def random_baseline(pairs: Sequence[StoryPair], seeds: int = SEEDS,
                    scheme: str = "tiered") -> dict[str, Any]:
    """Scores random tiered predictions on ``pairs`` with seeds 0..seeds-1 and averages them.

    Returns every ``metrics.tiered_metrics`` entry averaged over the seeds (``mean_of_trees``:
    scalars, per-attribute F1s, failure-mode counts, state contributions), the standard deviation
    of each of ``metrics.SCALAR_METRICS`` under ``std``, each seed's scalars under ``per_seed``,
    and ``num_pairs``, ``seeds``, ``scheme``.
    """
    if seeds < 1:
        raise ValueError("seeds must be at least 1")
    labels = label_arrays(pairs)
    per_seed = []
    for seed in range(seeds):
        preds = random_predictions(labels, np.random.default_rng(seed), scheme)
        per_seed.append(metrics.tiered_metrics(metrics.TieredArrays(**labels, **preds)))
    result: dict[str, Any] = mean_of_trees(per_seed)
    scalars = [{key: scores[key] for key in metrics.SCALAR_METRICS} for scores in per_seed]
    result["std"] = {key: float(np.std([row[key] for row in scalars]))
                     for key in metrics.SCALAR_METRICS}
    result.update(per_seed=scalars, num_pairs=len(pairs), seeds=seeds, scheme=scheme)
    return result


def report_name(seeds: int = SEEDS) -> str:
    """The baseline's row name in reports, e.g. "random baseline (10 seeds)"."""
    return f"random baseline ({seeds} seeds)"


def mean_of_trees(values: list[Any]) -> Any:
    """Mean of parallel metric trees: dicts by key, lists by position, numbers averaged
    (NaN values skipped), values equal in every tree (flags, names, sizes) kept as they are."""
    first = values[0]
    if isinstance(first, Mapping):
        return {key: mean_of_trees([v[key] for v in values]) for key in first}
    if isinstance(first, list):
        return [mean_of_trees(list(items)) for items in zip(*values)]
    if all(v == first for v in values):
        return first
    finite = [float(v) for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def summary(result: Mapping[str, Any], split: str) -> str:
    """One readable block of the baseline's mean ± std, in percent."""
    lines = [f"random baseline on {split}: {result['num_pairs']} pairs, {result['seeds']} seeds, "
             f"scheme {result['scheme']}"]
    for key in metrics.SCALAR_METRICS:
        lines.append(f"  {key:<21} {100 * result[key]:5.1f} ± {100 * result['std'][key]:.1f}")
    return "\n".join(lines)
