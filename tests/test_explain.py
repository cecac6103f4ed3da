"""Tests of pair explanations built from hand-made predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trip_jax.data import schema
from trip_jax.evaluation.explain import explain_pair, explanation_text

A = schema.NUM_ATTRIBUTES
POWER = schema.ATTRIBUTE_INDEX["power"]
OPEN = schema.ATTRIBUTE_INDEX["open"]
CONSCIOUS = schema.ATTRIBUTE_INDEX["conscious"]
H_LOCATION = schema.ATTRIBUTE_INDEX["h_location"]
SENTENCES = (
    ("Tom charged the phone.", "Tom went to work.", "Tom came home.", "Tom sat down.",
     "The phone rang."),
    ("Tom charged the phone.", "Tom unplugged the phone.", "Tom threw the charger away.",
     "Tom sat down.", "The phone rang."),
)
ENTITIES = (("phone", "Tom"), ("phone", "Tom", "charger"))


def predictions():
    """Padded [2, 3, 5, ...] predictions: story 0 plausible; story 1 conflicts at 2 and 5."""
    probs = np.full((2, 3, 5), 0.1, dtype=np.float32)
    probs[1, 0, 1] = 0.9
    probs[1, 0, 4] = 0.8
    probs[0, 2, :] = 0.99  # padding entity of story 0 (only 2 entities): must be ignored
    pre = np.zeros((2, 3, 5, A), dtype=np.int32)
    eff = np.zeros_like(pre)
    eff[1, 0, 1, POWER] = 1           # after sentence 2 the phone is unpowered
    pre[1, 0, 4, POWER] = 2           # sentence 5 needs it powered
    pre[1, 1, 4, CONSCIOUS] = 2       # default value: not evidence
    pre[1, 0, 1, OPEN] = 2            # precondition at the evidence sentence: not shown
    return probs, pre, eff


def test_explains_the_conflict_with_states_in_words():
    probs, pre, eff = predictions()
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)
    assert explanation["plausible_story"] == 0 and explanation["implausible_story"] == 1
    conflict = explanation["conflict"]
    assert (conflict["evidence"], conflict["breakpoint"]) == (1, 4)
    assert conflict["evidence_sentence"] == "Tom unplugged the phone."
    assert conflict["detected"] is True
    assert conflict["beliefs"] == pytest.approx([0.9, 0.8])
    assert [(s["entity"], s["sentence"], s["side"], s["attribute"], s["value"])
            for s in explanation["states"]] == [
        ("phone", 1, "effect", "power", "unpowered"),
        ("phone", 4, "precondition", "power", "powered")]
    assert explanation["text"] == (
        "Story 1 is plausible. In story 2, sentences 2 and 5 conflict: after sentence 2 the "
        "phone is unpowered; sentence 5 needs the phone to be powered.")
    assert json.loads(json.dumps(explanation)) == explanation


def test_per_story_arrays_and_story_index_one():
    probs, pre, eff = predictions()
    # Swap the stories and pass one array per story, each with its own entity count.
    swapped = [[x[1], x[0][:2]] for x in (probs, pre, eff)]
    explanation = explain_pair(1, *swapped, ENTITIES[::-1], SENTENCES[::-1])
    assert explanation["implausible_story"] == 0
    assert explanation["text"].startswith("Story 2 is plausible. In story 1, sentences 2 and 5")


def test_sentence_beliefs_come_from_any_entity():
    probs, pre, eff = predictions()
    probs[1, 0, 4] = 0.1
    probs[1, 2, 3] = 0.7  # the charger's track flags sentence 4
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)
    assert (explanation["conflict"]["evidence"], explanation["conflict"]["breakpoint"]) == (1, 3)
    # Only states at i (effects) and j (preconditions) are shown: nothing at sentence 4 now.
    assert [s["sentence"] for s in explanation["states"]] == [1]


def test_weak_beliefs_and_ties_pick_the_earliest_sentences():
    probs = np.full((2, 3, 5), 0.2)
    _, pre, eff = predictions()
    explanation = explain_pair(0, probs, np.zeros_like(pre), np.zeros_like(eff), ENTITIES,
                               SENTENCES)
    assert (explanation["conflict"]["evidence"], explanation["conflict"]["breakpoint"]) == (0, 1)
    assert explanation["conflict"]["detected"] is False
    assert explanation["states"] == []
    assert "weakly" in explanation["text"]
    assert explanation["text"].endswith("no predicted physical state supports it.")


def test_several_states_and_humans_read_naturally():
    probs, pre, eff = predictions()
    eff[1, 0, 1, OPEN] = 1
    pre[1, 1, 4, H_LOCATION] = 2
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)
    text = explanation["text"]
    assert "after sentence 2 the phone is unpowered and closed" in text
    # Three states in the text: the phone's (its power disagrees across the two sentences)
    # before Tom's, which is counted.
    assert "Tom" not in text and text.endswith(" (1 more predicted state).")
    assert ("Tom", "precondition", "moved") in {(s["entity"], s["side"], s["value"])
                                               for s in explanation["states"]}
    pre[1, 0, 4, POWER] = 0
    text = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)["text"]
    assert "sentence 5 needs Tom to be moved" in text


def test_explanation_text_matches_the_dict():
    probs, pre, eff = predictions()
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)
    assert explanation_text(explanation) == explanation["text"]


def test_bad_inputs_are_rejected():
    probs, pre, eff = predictions()
    with pytest.raises(ValueError, match="story_pred"):
        explain_pair(2, probs, pre, eff, ENTITIES, SENTENCES)
    with pytest.raises(ValueError, match="shape"):
        explain_pair(0, probs[:, :2], pre, eff, ENTITIES, SENTENCES)


def test_a_weak_model_still_gets_one_short_line():
    """Every state of every entity predicted at both sentences (issue 54's 1,296 characters):
    three states in the text, the conflicting pair's first, the rest counted; all in the JSON."""
    probs, pre, eff = predictions()
    pre[1, :, 4, :] = 1
    eff[1, :, 1, :] = 1
    pre[1, 0, 4, POWER] = 2  # the phone's power disagrees across the two sentences
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES)
    text = explanation["text"]
    assert len(explanation["states"]) > 50
    assert len(text) <= 300, (len(text), text)
    assert text.startswith("Story 1 is plausible. In story 2, sentences 2 and 5 conflict: ")
    assert "after sentence 2 the phone is unpowered" in text
    assert "sentence 5 needs the phone to be powered" in text
    assert text.endswith(f" ({len(explanation['states']) - 3} more predicted states).")
    assert explanation_text(explanation) == text


def test_the_backing_contradiction_comes_first_and_counts_two_of_three():
    probs, pre, eff = predictions()
    eff[1, 1, 1, H_LOCATION] = 1
    pre[1, 2, 4, OPEN] = 1
    explanation = explain_pair(0, probs, pre, eff, ENTITIES, SENTENCES, backing={
        "story": 1, "evidence": 1, "breakpoint": 4, "entity": 0, "attribute": "power",
        "effect_value": "unpowered", "precondition_value": "powered"})
    assert len(explanation["states"]) == 4
    text = explanation["text"]
    assert text.startswith(
        "Story 1 is plausible. In story 2, sentences 2 and 5 conflict: after sentence 2 the "
        "phone is unpowered, but sentence 5 needs it powered; ")
    assert text == (
        "Story 1 is plausible. In story 2, sentences 2 and 5 conflict: after sentence 2 the "
        "phone is unpowered, but sentence 5 needs it powered; after sentence 2 Tom is "
        "disappeared (1 more predicted state).")
