"""Tests of the random tiered baseline on a few hand-built story pairs."""

from __future__ import annotations

import numpy as np
import pytest

from trip_jax.data import schema
from trip_jax.evaluation import metrics
from trip_jax.runtime import paths
from trip_jax.evaluation import random_baseline as rb
from trip_jax.data.types import Story, StoryPair, empty_states

POWER = schema.ATTRIBUTE_INDEX["power"]


def make_pair(pair_id: str, label: int, num_sentences: int = 5, entities=("phone", "Tom"),
              conflict=(1, 3)) -> StoryPair:
    """A pair whose implausible story (1 - label) has a power conflict for its first entity."""
    plausible = Story(f"{pair_id}-p", tuple(f"s{x}" for x in range(num_sentences)),
                      entities[:1], empty_states(1, num_sentences), True)
    states = empty_states(len(entities), num_sentences)
    i, j = conflict
    states[0, i, 1, POWER] = 1
    states[0, j, 0, POWER] = 2
    implausible = Story(f"{pair_id}-i", plausible.sentences, tuple(entities), states, False,
                        (conflict,))
    stories = (plausible, implausible) if label == 0 else (implausible, plausible)
    return StoryPair(pair_id, stories, label)


PAIRS = [make_pair("a", 0), make_pair("b", 1, num_sentences=6, entities=("cup", "Ann", "tap")),
         make_pair("c", 1, conflict=(0, 4))]


def test_label_arrays_pad_and_mask():
    labels = rb.label_arrays(PAIRS)
    assert labels["conflict_label"].shape == (3, 2, 3, 6)
    assert labels["pre_label"].shape == (3, 2, 3, 6, schema.NUM_ATTRIBUTES)
    assert labels["story_label"].tolist() == [0, 1, 1]
    assert labels["mask"][0, 0].sum() == 1 * 5 and labels["mask"][0, 1].sum() == 2 * 5
    assert labels["mask"][1, 0].sum() == 3 * 6 and not labels["mask"][0, 1, 2].any()
    assert np.flatnonzero(labels["conflict_label"][2, 0, 0]).tolist() == [0, 4]
    assert labels["eff_label"][0, 1, 0, 1, POWER] == 1
    assert labels["pre_label"][0, 1, 0, 3, POWER] == 2
    assert not labels["conflict_label"][~labels["mask"]].any()


def test_tiered_scheme_flags_one_pair_in_the_story_predicted_implausible():
    labels = rb.label_arrays(PAIRS)
    for seed in range(5):
        preds = rb.random_predictions(labels, np.random.default_rng(seed))
        mask = labels["mask"]
        for x in range(len(PAIRS)):
            k = 1 - preds["story_pred"][x]
            flagged = preds["conflict_prob"][x] >= 0.5
            assert flagged[k].sum() == 2 and flagged[1 - k].sum() == 0
            assert (flagged[k].sum(axis=1) > 0).sum() == 1  # a single entity
        assert not preds["conflict_prob"][~mask].any()
        for side in ("pre_pred", "eff_pred"):
            assert not preds[side][~mask].any()
            assert (preds[side] < schema.num_classes_array()).all()


def test_reference_scheme_flags_two_sentences_per_entity_of_the_gold_implausible_story():
    labels = rb.label_arrays(PAIRS)
    preds = rb.random_predictions(labels, np.random.default_rng(0), scheme="reference")
    for x, pair in enumerate(PAIRS):
        k = 1 - pair.label
        per_entity = (preds["conflict_prob"][x, k] >= 0.5).sum(axis=1)
        real = pair.stories[k].num_entities
        assert per_entity[:real].tolist() == [2] * real
        assert not preds["conflict_prob"][x, 1 - k].any()


def test_states_are_drawn_over_every_class():
    labels = rb.label_arrays(PAIRS)
    preds = rb.random_predictions(labels, np.random.default_rng(1))
    location = preds["pre_pred"][..., schema.ATTRIBUTE_INDEX["location"]][labels["mask"]]
    assert set(location.tolist()) == set(range(9))


def test_two_sentence_stories_make_consistency_equal_accuracy():
    # With two sentences the only pair is the gold pair, so conflicts are always right.
    pairs = [make_pair(str(x), x % 2, num_sentences=2, conflict=(0, 1)) for x in range(8)]
    result = rb.random_baseline(pairs, seeds=3)
    for row in result["per_seed"]:
        assert row["consistency"] == row["accuracy"]
    assert result["verifiability"] <= result["consistency"]


def test_baseline_averages_seeds_and_is_reproducible():
    first = rb.random_baseline(PAIRS, seeds=4)
    # NaN (an attribute without gold or predicted states) != NaN: compare the JSON forms.
    assert paths.to_jsonable(first) == paths.to_jsonable(rb.random_baseline(PAIRS, seeds=4))
    assert first["num_pairs"] == 3 and first["seeds"] == 4 and len(first["per_seed"]) == 4
    for key in metrics.SCALAR_METRICS:
        assert first[key] == pytest.approx(np.mean([row[key] for row in first["per_seed"]]))
        assert first["std"][key] >= 0
    assert first["accuracy"] >= first["consistency"] >= first["verifiability"]
    with pytest.raises(ValueError):
        rb.random_baseline(PAIRS, seeds=0)
    with pytest.raises(ValueError, match="scheme"):
        rb.random_baseline(PAIRS, scheme="uniform")


def test_every_metric_is_averaged_over_the_seeds():
    result = rb.random_baseline(PAIRS, seeds=3)
    per_seed = [metrics.tiered_metrics(metrics.TieredArrays(
        **rb.label_arrays(PAIRS), **rb.random_predictions(rb.label_arrays(PAIRS),
                                                          np.random.default_rng(seed))))
        for seed in range(3)]
    counts = [[m["count"] for m in scores["failure_modes"]] for scores in per_seed]
    assert [m["count"] for m in result["failure_modes"]] == pytest.approx(
        np.mean(counts, axis=0).tolist())
    assert sum(m["count"] for m in result["failure_modes"]) == pytest.approx(len(PAIRS))
    assert set(result["precondition_f1_per_attribute"]) == set(schema.ATTRIBUTES)


def test_mean_of_metric_trees():
    trees = [{"a": 1.0, "n": 8, "flag": True, "rows": [{"c": 2}], "f": float("nan")},
             {"a": 3.0, "n": 8, "flag": True, "rows": [{"c": 5}], "f": 0.5}]
    assert rb.mean_of_trees(trees) == {"a": 2.0, "n": 8, "flag": True, "rows": [{"c": 3.5}],
                                       "f": 0.5}


def test_summary_gives_mean_and_spread_in_percent():
    text = rb.summary(rb.random_baseline(PAIRS, seeds=2), "dev")
    assert text.startswith("random baseline on dev: 3 pairs, 2 seeds, scheme tiered")
    assert all(key in text for key in metrics.SCALAR_METRICS) and "±" in text
