"""Tests of the pure-numpy TRIP metrics: every clause of docs/reference.md "Metrics" on hand-built
pairs."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trip_jax.data import schema
from trip_jax.evaluation import metrics

E, S, A = 3, 5, schema.NUM_ATTRIBUTES
POWER = schema.ATTRIBUTE_INDEX["power"]
OPEN = schema.ATTRIBUTE_INDEX["open"]
CONSCIOUS = schema.ATTRIBUTE_INDEX["conscious"]  # default value 2
LOCATION = schema.ATTRIBUTE_INDEX["location"]
EV, BP = 1, 3  # evidence and breakpoint sentences of the hand-built implausible story


def gold_pair(label: int = 0) -> dict[str, np.ndarray]:
    """One pair: story 1 - label is implausible; entity 0 (a phone) conflicts at sentences EV, BP.

    After EV the phone is unpowered (effect power = 1); sentence BP needs it powered (pre = 2).
    Entity 2 is padding in both stories; sentence 4 is padding in the plausible story.
    """
    k = 1 - label
    pre = np.zeros((1, 2, E, S, A), dtype=np.int32)
    eff = np.zeros_like(pre)
    conflict = np.zeros((1, 2, E, S), dtype=np.int32)
    eff[0, k, 0, EV, POWER] = 1
    pre[0, k, 0, BP, POWER] = 2
    pre[0, k, 1, 0, OPEN] = 1  # an unrelated state elsewhere
    conflict[0, k, 0, [EV, BP]] = 1
    mask = np.ones((1, 2, E, S), dtype=bool)
    mask[:, :, 2] = False
    mask[0, label, :, 4] = False
    return {"story_label": np.array([label]), "conflict_label": conflict,
            "pre_label": pre, "eff_label": eff, "mask": mask}


def perfect(gold: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Predictions equal to the gold labels (beliefs 0.9 where the label is 1)."""
    return {"story_pred": gold["story_label"].copy(),
            "conflict_prob": gold["conflict_label"] * 0.9,
            "pre_pred": gold["pre_label"].copy(), "eff_pred": gold["eff_label"].copy()}


def arrays(gold, pred) -> metrics.TieredArrays:
    """The metric inputs of a gold dict and a prediction dict."""
    return metrics.TieredArrays(**gold, **pred)


def score(gold, pred):
    """tiered_metrics on a gold dict and a prediction dict."""
    return metrics.tiered_metrics(arrays(gold, pred))


def tiers(result) -> tuple[float, float, float]:
    """(accuracy, consistency, verifiability) of a metrics dict."""
    return result["accuracy"], result["consistency"], result["verifiability"]


@pytest.mark.parametrize("label", [0, 1])
def test_perfect_prediction_is_verifiable_for_either_label(label):
    gold = gold_pair(label)
    result = score(gold, perfect(gold))
    assert tiers(result) == (1.0, 1.0, 1.0)
    assert result["conflict_f1"] == 1.0 and result["conflict_f1_positive"] == 1.0
    assert result["precondition_f1"] == 1.0 and result["effect_f1"] == 1.0


def test_implausible_story_is_one_minus_label():
    # States right in the plausible story only: the implausible one (1 - label) has none.
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["eff_pred"] = np.zeros_like(pred["eff_pred"])
    pred["pre_pred"] = np.zeros_like(pred["pre_pred"])
    pred["eff_pred"][0, 0, 0, EV, POWER] = 1
    pred["pre_pred"][0, 0, 0, BP, POWER] = 2
    assert tiers(score(gold, pred)) == (1.0, 1.0, 0.0)


def test_wrong_story_counts_for_nothing_else():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["story_pred"] = np.array([1])
    result = score(gold, pred)
    assert tiers(result) == (0.0, 0.0, 0.0)
    cell = [m for m in result["failure_modes"] if m["count"]]
    assert cell == [{"story": False, "conflict": True, "states": True, "count": 1,
                     "fraction": 1.0}]


def test_conflict_set_with_three_sentences_is_not_consistent():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, 1, 1, 4] = 0.7  # another entity flags a third sentence
    outcomes = metrics.pair_outcomes(arrays(gold, pred))
    assert outcomes["predicted_sentences"][0].tolist() == [False, True, False, True, True]
    assert tiers(score(gold, pred)) == (1.0, 0.0, 0.0)


def test_conflict_flagged_in_the_plausible_story_counts():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, 0, 1, 2] = 0.6  # any story and entity joins the predicted set
    assert tiers(score(gold, pred)) == (1.0, 0.0, 0.0)


def test_same_set_spread_over_entities_is_consistent():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, 1, 0, EV] = 0.1
    pred["conflict_prob"][0, 1, 1, EV] = 0.8  # sentence EV comes from another entity now
    assert tiers(score(gold, pred)) == (1.0, 1.0, 1.0)


def test_threshold_is_inclusive_and_missing_sentence_breaks_consistency():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, 1, 0, BP] = 0.5
    assert tiers(score(gold, pred)) == (1.0, 1.0, 1.0)
    pred["conflict_prob"][0, 1, 0, BP] = 0.49
    assert tiers(score(gold, pred)) == (1.0, 0.0, 0.0)


def test_default_valued_prediction_is_ignored():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["eff_pred"][0, 1, 1, EV, CONSCIOUS] = 2  # default (true) though gold says 0: no evidence
    assert tiers(score(gold, pred)) == (1.0, 1.0, 1.0)
    pred["eff_pred"][0, 1, 1, EV, CONSCIOUS] = 1  # non-default and wrong: breaks it
    assert tiers(score(gold, pred)) == (1.0, 1.0, 0.0)


def test_only_default_valued_predictions_are_no_evidence():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["eff_pred"][...] = 0
    pred["pre_pred"][...] = 0
    pred["eff_pred"][0, 1, 0, EV, CONSCIOUS] = 2
    assert tiers(score(gold, pred)) == (1.0, 1.0, 0.0)


def test_wrong_state_at_the_evidence_sentence():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["eff_pred"][0, 1, 0, EV, POWER] = 2
    result = score(gold, pred)
    assert tiers(result) == (1.0, 1.0, 0.0)
    assert [m["count"] for m in result["failure_modes"]][:2] == [0, 1]  # (T, T, T), (T, T, F)


def test_wrong_extra_state_of_another_entity_at_the_breakpoint():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["pre_pred"][0, 1, 1, BP, OPEN] = 2
    assert tiers(score(gold, pred)) == (1.0, 1.0, 0.0)


def test_only_effects_at_i_and_preconditions_at_j_are_checked():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["pre_pred"][0, 1, 0, EV, OPEN] = 2   # precondition at the evidence sentence: not checked
    pred["eff_pred"][0, 1, 0, BP, OPEN] = 2   # effect at the breakpoint: not checked
    pred["eff_pred"][0, 0, 0, EV, POWER] = 2  # plausible story: not checked
    assert tiers(score(gold, pred)) == (1.0, 1.0, 1.0)


def test_one_side_of_evidence_is_enough():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["pre_pred"][0, 1, 0, BP, POWER] = 0  # nothing at the breakpoint, effect at i still right
    assert tiers(score(gold, pred)) == (1.0, 1.0, 1.0)


def test_correct_story_and_conflict_without_state_evidence_is_not_verifiable():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["eff_pred"][...] = 0
    pred["pre_pred"][...] = 0
    result = score(gold, pred)
    assert tiers(result) == (1.0, 1.0, 0.0)
    assert result["effect_f1"] < 1.0


def test_padded_rows_are_ignored():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, :, 2, :] = 0.99   # padded entity
    pred["conflict_prob"][0, 0, 0, 4] = 0.99   # padded sentence of the plausible story
    pred["eff_pred"][0, 1, 2, EV, POWER] = 2    # wrong state on a padded entity
    pred["pre_pred"][0, 0, :, 4, LOCATION] = 5
    result = score(gold, pred)
    assert tiers(result) == (1.0, 1.0, 1.0)
    assert result["conflict_f1"] == 1.0 and result["precondition_f1"] == 1.0
    unmasked = dict(gold, mask=np.ones_like(gold["mask"]))
    assert tiers(score(unmasked, pred)) == (1.0, 0.0, 0.0)


def test_gold_set_must_be_a_pair():
    gold = gold_pair(0)
    gold["conflict_label"][0, 1, 1, 4] = 1  # three gold sentences: never consistent
    pred = perfect(gold)
    assert tiers(score(gold, pred)) == (1.0, 0.0, 0.0)


def test_macro_f1_over_present_classes():
    gold = gold_pair(0)
    pred = perfect(gold)
    # power over the real rows: gold has one effect 1; predict 2 there instead.
    pred["eff_pred"][0, 1, 0, EV, POWER] = 2
    result = score(gold, pred)
    # classes present: 0 (F1 1), 1 (gold only: 0), 2 (predicted only: 0) -> 1/3.
    assert result["effect_f1_per_attribute"]["power"] == pytest.approx(1 / 3)
    # Attributes with only class 0 everywhere score 1.
    assert result["effect_f1_per_attribute"]["wet"] == 1.0
    assert result["effect_f1"] == pytest.approx((19 + 1 / 3) / 20)
    assert result["precondition_f1"] == 1.0


def test_conflict_f1_counts_entity_rows():
    gold = gold_pair(0)
    pred = perfect(gold)
    pred["conflict_prob"][0, 1, 0, BP] = 0.0  # one of the two positives missed
    pred["conflict_prob"][0, 1, 1, 0] = 0.8  # one false positive
    result = score(gold, pred)
    assert result["conflict_f1_positive"] == pytest.approx(2 * 1 / (2 + 2))
    # class 0 over the real rows: tp = negatives - 1, one false positive, one missed positive.
    negatives = int(gold["mask"].sum()) - 2
    neg_f1 = 2 * (negatives - 1) / (2 * (negatives - 1) + 2)
    assert result["conflict_f1"] == pytest.approx((0.5 + neg_f1) / 2)


def test_failure_modes_cover_all_pairs():
    pairs = [gold_pair(0), gold_pair(1), gold_pair(0)]
    gold = {key: np.concatenate([p[key] for p in pairs]) for key in pairs[0]}
    pred = perfect(gold)
    pred["story_pred"][1] = 0                         # wrong story, rest right
    pred["conflict_prob"][2, 0, 1, 0] = 0.9           # right story, wrong conflict, states right
    result = score(gold, pred)
    counts = {(m["story"], m["conflict"], m["states"]): m["count"]
              for m in result["failure_modes"]}
    assert len(counts) == 8 and sum(counts.values()) == 3
    assert counts[(True, True, True)] == 1
    assert counts[(False, True, True)] == 1
    assert counts[(True, False, True)] == 1
    assert sum(m["fraction"] for m in result["failure_modes"]) == pytest.approx(1.0)
    assert result["num_pairs"] == 3
    assert tiers(result) == pytest.approx((2 / 3, 1 / 3, 1 / 3))


def test_state_contribution_counts_correct_states_in_detected_conflicts():
    pairs = [gold_pair(0), gold_pair(0)]
    gold = {key: np.concatenate([p[key] for p in pairs]) for key in pairs[0]}
    pred = perfect(gold)
    pred["story_pred"][1] = 1  # second pair not consistent: its correct states do not count
    result = score(gold, pred)
    power = result["state_contribution"]["power"]
    assert power["correct"] == 4 and power["in_detected_conflicts"] == 2
    assert power["share"] == 0.5 and power["f1"] == 1.0
    opened = result["state_contribution"]["open"]  # at sentence 0: never in the conflict
    assert opened["correct"] == 2 and opened["in_detected_conflicts"] == 0
    assert np.isnan(result["state_contribution"]["wet"]["share"])


def test_outcome_record_is_plain_json():
    gold = gold_pair(1)
    pred = perfect(gold)
    outcomes = metrics.pair_outcomes(arrays(gold, pred))
    record = metrics.outcome_record(outcomes, 0)
    assert record == {"correct": True, "consistent": True, "verifiable": True,
                      "conflict_correct": True, "states_correct": True,
                      "predicted_conflict": [EV, BP], "gold_conflict": [EV, BP]}


def test_mask_none_means_all_rows_real():
    gold = gold_pair(0)
    gold["mask"][...] = True
    pred = perfect(gold)
    with_mask = score(gold, pred)
    del gold["mask"]
    without = score(gold, pred)
    assert tiers(with_mask) == tiers(without) == (1.0, 1.0, 1.0)


def test_bad_inputs_are_rejected():
    gold = gold_pair(0)
    pred = perfect(gold)
    with pytest.raises(ValueError, match="story"):
        score(gold, dict(pred, story_pred=np.array([2])))
    with pytest.raises(ValueError, match="eff_pred"):
        score(gold, dict(pred, eff_pred=pred["eff_pred"][..., :5]))
    bad = pred["pre_pred"].copy()
    bad[0, 1, 0, 0, POWER] = 3  # power has 3 classes
    with pytest.raises(ValueError, match="pre_pred"):
        score(gold, dict(pred, pre_pred=bad))


def test_metrics_module_does_not_import_jax():
    # A fresh interpreter: importing the metrics must not load JAX, even indirectly.
    code = ("import sys, trip_jax.evaluation.metrics; "
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=pathlib.Path(metrics.__file__).parents[2])
    assert out.stdout.strip() == "[]"


@st.composite
def random_case(draw):
    """Random small arrays, biased so that every tier is sometimes right."""
    n = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = (n, 2, 2, 4)
    story_label = rng.integers(0, 2, n)
    story_pred = np.where(rng.random(n) < 0.7, story_label, 1 - story_label)
    conflict_label = np.zeros(shape, dtype=np.int32)
    for x in range(n):
        i, j = sorted(rng.choice(4, 2, replace=False))
        conflict_label[x, 1 - story_label[x], 0, [i, j]] = 1
    flip = rng.random(shape) < 0.05
    conflict_prob = np.where(flip, 1 - conflict_label, conflict_label) * rng.uniform(0.5, 1, shape)
    num_classes = schema.num_classes_array()
    labels = [(rng.random(shape + (A,)) ** 8 * num_classes).astype(np.int32) for _ in range(2)]
    preds = [np.where(rng.random(shape + (A,)) < 0.97, lab,
                      (rng.random(shape + (A,)) * num_classes).astype(np.int32)) for lab in labels]
    mask = rng.random(shape) < 0.9
    return (story_label, story_pred, conflict_label, conflict_prob, labels[0], preds[0],
            labels[1], preds[1], mask)


@settings(max_examples=60, deadline=None)
@given(random_case())
def test_accuracy_bounds_consistency_bounds_verifiability(case):
    result = metrics.tiered_metrics(metrics.TieredArrays(*case))
    assert result["accuracy"] >= result["consistency"] >= result["verifiability"]
    modes = {(m["story"], m["conflict"], m["states"]): m["fraction"]
             for m in result["failure_modes"]}
    assert modes[(True, True, True)] == pytest.approx(result["verifiability"])
    assert modes[(True, True, True)] + modes[(True, True, False)] == pytest.approx(
        result["consistency"])
