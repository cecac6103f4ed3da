"""Coherent decoding (trip_jax/evaluation/decoding.py) on hand-made pairs, and both decodings scored
side by side (evaluate.decoded_metrics)."""

import dataclasses

import numpy as np
import pytest

from trip_jax.data import schema
from trip_jax.evaluation import decoding, evaluate, explain, metrics
from trip_jax.evaluation.decoding import FALSE, TRUE, DecodingConfig

POWER = schema.ATTRIBUTE_INDEX["power"]
OPEN = schema.ATTRIBUTE_INDEX["open"]
COHERENT = DecodingConfig(method="coherent")
E, S = 2, 5


def confident(states: dict[tuple[int, int, int, int], int], sure: float = 8.0) -> np.ndarray:
    """Logits [2, E, S, 20, 9] that predict class 0 everywhere except ``states``:
    {(story, entity, sentence, attribute): class}."""
    logits = np.zeros((2, E, S, schema.NUM_ATTRIBUTES, schema.MAX_CLASSES))
    logits[..., 0] = sure
    logits[..., 3:] = -1e9
    logits[..., schema.ATTRIBUTE_INDEX["location"], 3:] = 0.0
    for (k, e, s, a), c in states.items():
        logits[k, e, s, a] = np.where(np.arange(schema.MAX_CLASSES) < schema.NUM_CLASSES[a],
                                      0.0, -1e9)
        logits[k, e, s, a, c] = sure
    return logits


def pair(pre_states=None, eff_states=None, *, story_pred=0, conflict_logits=None,
         row_mask=None, pre_logits=None, eff_logits=None):
    """One pair's outputs with the pair axis (N = 1), as the evaluator holds them."""
    pre = confident(pre_states or {}) if pre_logits is None else pre_logits
    eff = confident(eff_states or {}) if eff_logits is None else eff_logits
    mask = np.ones((2, E, S), bool) if row_mask is None else row_mask
    arrays = {
        "pre_logits": pre, "eff_logits": eff,
        "pre_pred": pre.argmax(-1) * mask[..., None], "eff_pred": eff.argmax(-1) * mask[..., None],
        "conflict_logits": np.zeros((2, E, S)) if conflict_logits is None else conflict_logits,
        "conflict_prob": np.full((2, E, S), 0.3), "story_pred": np.int64(story_pred),
        "story_logits": np.zeros(2), "row_mask": mask,
    }
    return {k: np.asarray(v)[None] for k, v in arrays.items()}


def assert_backed(decoded: decoding.Decoded, n: int = 0) -> decoding.Contradiction:
    """The decoded conflict of pair n is backed by its decoded states, in the implausible story,
    and is exactly the sentences whose belief reaches 0.5."""
    found = decoded.contradictions[n]
    assert found is not None
    k = found.story
    assert k == 1 - decoded.story_pred[n]
    assert decoded.eff_pred[n, k, found.entity, found.evidence, found.attribute] == found.effect
    assert (decoded.pre_pred[n, k, found.entity, found.breakpoint, found.attribute]
            == found.precondition)
    assert {found.effect, found.precondition} == {FALSE, TRUE}
    flagged = np.flatnonzero((decoded.conflict_prob[n] >= 0.5).any(axis=(0, 1)))
    assert flagged.tolist() == [found.evidence, found.breakpoint]
    assert not (decoded.conflict_prob[n, 1 - k] >= 0.5).any()
    return found


def test_the_story_with_a_backed_contradiction_is_implausible():
    # Story 1: sentence 1 makes the phone powered, sentence 3 needs it unpowered.
    arrays = pair(pre_states={(1, 0, 3, POWER): FALSE}, eff_states={(1, 0, 1, POWER): TRUE})
    decoded = decoding.decode(arrays, COHERENT)
    assert decoded.story_pred.tolist() == [0]
    found = assert_backed(decoded)
    assert (found.story, found.entity, found.attribute, found.evidence, found.breakpoint) == (
        1, 0, POWER, 1, 3)
    # Entity 1 has no state at sentences 1 or 3, so only entity 0's rows are flagged.
    assert decoded.conflict_prob[0, 1, 1].tolist() == [0, 0, 0, 0, 0]
    # Independent decoding keeps the model's own story.
    assert decoding.decode(arrays, DecodingConfig()).story_pred.tolist() == [0]


def test_the_backing_states_may_differ_from_the_heads_argmax():
    # The effect head leans to "unknown" at sentence 0 but gives "open" real weight; nothing else
    # contradicts anything, so that contradiction is decoded and its effect is set.
    eff = confident({})
    eff[0, 1, 0, OPEN, :3] = [1.0, -2.0, 0.5]
    arrays = pair(pre_states={(0, 1, 2, OPEN): FALSE}, eff_logits=eff, story_pred=0)
    assert arrays["eff_pred"][0, 0, 1, 0, OPEN] == 0
    decoded = decoding.decode(arrays, COHERENT)
    found = assert_backed(decoded)
    assert (found.story, found.entity, found.evidence, found.breakpoint) == (0, 1, 0, 2)
    assert decoded.eff_pred[0, 0, 1, 0, OPEN] == TRUE
    assert decoded.story_pred.tolist() == [1]
    # Every other state is the heads' argmax.
    changed = decoded.eff_pred != arrays["eff_pred"]
    assert changed.sum() == 1


def test_the_stronger_contradiction_decides_the_story():
    pre = confident({(0, 0, 4, POWER): FALSE, (1, 0, 2, OPEN): TRUE}, sure=8.0)
    pre[0, 0, 4, POWER, :3] = [0.0, 1.0, 0.0]  # story 0's evidence is weak
    arrays = pair(pre_logits=pre, eff_states={(0, 0, 0, POWER): TRUE, (1, 0, 1, OPEN): FALSE})
    decoded = decoding.decode(arrays, COHERENT)
    assert decoded.story_pred.tolist() == [0]
    assert assert_backed(decoded).attribute == OPEN


def test_an_effect_in_between_undoes_the_evidence_with_persistence():
    # Story 0: powered at 0, unpowered again at 1, needs unpowered at 3: no conflict.
    # Story 1: a weaker but real contradiction (open at 0, needs closed at 2).
    pre = confident({(0, 0, 3, POWER): FALSE, (1, 0, 2, OPEN): FALSE})
    pre[1, 0, 2, OPEN, :3] = [0.0, 2.0, 0.0]
    arrays = pair(pre_logits=pre, eff_states={(0, 0, 0, POWER): TRUE, (0, 0, 1, POWER): FALSE,
                                              (1, 0, 0, OPEN): TRUE})
    with_persistence = decoding.decode(arrays, COHERENT)
    assert with_persistence.story_pred.tolist() == [0]
    assert assert_backed(with_persistence).attribute == OPEN
    without = decoding.decode(arrays, dataclasses.replace(COHERENT, persistence=False))
    assert without.story_pred.tolist() == [1]
    assert assert_backed(without).attribute == POWER


def test_the_detector_beliefs_break_a_tie_when_weighted():
    # The same contradiction in entity 0 of both stories; the detector believes story 1's.
    states = dict(pre_states={(0, 0, 2, POWER): FALSE, (1, 0, 2, POWER): FALSE},
                  eff_states={(0, 0, 0, POWER): TRUE, (1, 0, 0, POWER): TRUE})
    beliefs = np.full((2, E, S), -3.0)
    beliefs[1, 0, [0, 2]] = 3.0
    arrays = pair(**states, conflict_logits=beliefs, story_pred=1)
    assert decoding.decode(arrays, dataclasses.replace(
        COHERENT, detector_weight=1.0)).story_pred.tolist() == [0]
    # Unweighted the two stories tie and the model's own story_pred decides.
    assert decoding.decode(arrays, COHERENT).story_pred.tolist() == [1]


@pytest.mark.parametrize("story_pred", [0, 1])
def test_ties_between_stories_keep_the_models_own_story(story_pred):
    states = dict(pre_states={(0, 0, 2, POWER): FALSE, (1, 0, 2, POWER): FALSE},
                  eff_states={(0, 0, 0, POWER): TRUE, (1, 0, 0, POWER): TRUE})
    decoded = decoding.decode(pair(**states, story_pred=story_pred), COHERENT)
    assert decoded.story_pred.tolist() == [story_pred]
    assert assert_backed(decoded).story == 1 - story_pred


def test_ties_within_a_story_go_to_the_first_entity_then_sentence():
    states = dict(pre_states={(1, 0, 3, POWER): FALSE, (1, 1, 3, POWER): FALSE,
                              (1, 1, 2, POWER): FALSE},
                  eff_states={(1, 0, 1, POWER): TRUE, (1, 1, 0, POWER): TRUE})
    # Without the persistence term the three candidates score exactly the same (with it they
    # differ by rounding in the sums over the sentences in between).
    exact_tie = dataclasses.replace(COHERENT, persistence=False)
    found = assert_backed(decoding.decode(pair(**states), exact_tie))
    assert (found.entity, found.evidence, found.breakpoint) == (0, 1, 3)


def test_padding_rows_never_back_a_contradiction():
    mask = np.ones((2, E, S), bool)
    mask[1, 0, 3:] = False  # story 1, entity 0 has 3 sentences
    arrays = pair(pre_states={(1, 0, 3, POWER): FALSE, (0, 1, 4, OPEN): FALSE},
                  eff_states={(1, 0, 1, POWER): TRUE, (0, 1, 2, OPEN): TRUE}, row_mask=mask)
    found = assert_backed(decoding.decode(arrays, COHERENT))
    assert (found.story, found.attribute) == (0, OPEN)


def test_a_story_too_short_for_a_contradiction_leaves_the_models_own_story():
    mask = np.zeros((2, E, S), bool)
    mask[:, :, 0] = True  # one sentence per story: no candidate anywhere
    decoded = decoding.decode(pair(row_mask=mask, story_pred=1), COHERENT)
    assert decoded.story_pred.tolist() == [1]
    assert decoded.contradictions == [None]
    assert not (decoded.conflict_prob >= 0.5).any()


def random_pairs(rng, n=12):
    """N random pairs of soft outputs with ragged real rows and random labels."""
    shape = (n, 2, E, S)
    mask = np.zeros(shape, bool)
    for x in range(n):
        for k in (0, 1):
            mask[x, k, :rng.integers(1, E + 1), :rng.integers(2, S + 1)] = True
    classes = schema.num_classes_array()
    logits = {key: np.where(np.arange(schema.MAX_CLASSES) < classes[:, None],
                            rng.normal(0, 2, (*shape, schema.NUM_ATTRIBUTES, schema.MAX_CLASSES)),
                            -1e9) for key in ("pre_logits", "eff_logits")}
    arrays = {**logits, "row_mask": mask,
              "pre_pred": logits["pre_logits"].argmax(-1) * mask[..., None],
              "eff_pred": logits["eff_logits"].argmax(-1) * mask[..., None],
              "conflict_logits": rng.normal(0, 2, shape),
              "story_pred": rng.integers(0, 2, n), "story_label": rng.integers(0, 2, n)}
    arrays["conflict_prob"] = 1 / (1 + np.exp(-arrays["conflict_logits"])) * mask
    gold = np.zeros(shape, np.int64)
    for x in range(n):
        k = 1 - arrays["story_label"][x]
        gold[x, k, :, [0, 1]] = mask[x, k, :, [0, 1]]
    labels = {"conflict_label": gold}
    for key in ("pre_label", "eff_label"):
        labels[key] = rng.integers(0, 3, (*shape, schema.NUM_ATTRIBUTES)) * mask[..., None]
        labels[key] = np.minimum(labels[key], classes - 1)
    return {**arrays, **labels}


@pytest.mark.parametrize("seed", range(3))
def test_every_decoded_conflict_is_backed(seed):
    arrays = random_pairs(np.random.default_rng(seed))
    for weight in (0.0, 0.5):
        decoded = decoding.decode(arrays, dataclasses.replace(COHERENT, detector_weight=weight))
        for n in range(len(decoded.story_pred)):
            assert_backed(decoded, n)


@pytest.mark.parametrize("seed", range(3))
def test_both_decodings_are_scored_side_by_side(seed):
    arrays = random_pairs(np.random.default_rng(seed))
    scores, decoded, outcomes = evaluate.decoded_metrics(arrays, COHERENT)
    assert scores["decoding"] == "coherent"
    for method in decoding.DECODINGS:
        tiers = [scores[f"{method}/{key}"] for key in metrics.TIER_METRICS]
        assert tiers[0] >= tiers[1] >= tiers[2]
        assert set(outcomes[method]) >= {"correct", "consistent", "verifiable"}
    assert scores["accuracy"] == scores["coherent/accuracy"]
    independent = metrics.tiered_metrics(metrics.TieredArrays.from_mapping(arrays))
    assert scores["independent/consistency"] == independent["consistency"]
    # The state F1s are those of the decoded states (the ones the explanation names).
    again = metrics.tiered_metrics(metrics.TieredArrays.from_mapping(
        {**arrays, **decoded.predictions()}))
    assert scores["precondition_f1"] == again["precondition_f1"]


def test_the_explanation_names_the_backing_states():
    arrays = pair(pre_states={(1, 0, 3, POWER): FALSE}, eff_states={(1, 0, 1, POWER): TRUE})
    decoded = decoding.decode(arrays, COHERENT)
    found = decoded.contradictions[0]
    names = [["phone", "Tom"], ["phone", "Tom"]]
    sentences = [[f"Sentence {s}." for s in range(S)]] * 2
    result = explain.explain_pair(int(decoded.story_pred[0]), decoded.conflict_prob[0],
                                  decoded.pre_pred[0], decoded.eff_pred[0], names, sentences,
                                  backing=found.as_dict())
    assert result["backing"]["entity"] == "phone"
    assert (result["conflict"]["evidence"], result["conflict"]["breakpoint"]) == (1, 3)
    assert result["conflict"]["detected"]
    assert "after sentence 2 the phone is powered, but sentence 4 needs it unpowered" in (
        result["text"])
    moved = {**found.as_dict(), "breakpoint": 2}
    with pytest.raises(ValueError, match="not the decoded conflict"):
        explain.explain_pair(int(decoded.story_pred[0]), decoded.conflict_prob[0],
                             decoded.pre_pred[0], decoded.eff_pred[0], names, sentences,
                             backing=moved)


def test_a_state_below_the_threshold_is_not_asserted_but_the_backing_always_is():
    eff = confident({(1, 0, 1, POWER): TRUE})
    pre = confident({(1, 0, 3, POWER): FALSE})
    # Sentence 2 of story 1: entity 1 is open with probability 0.4 (argmax over 3 classes).
    eff[1, 1, 2, OPEN, :3] = np.log([0.3, 0.3, 0.4])
    # The backing effect itself is a weak belief (0.45): it is decoded all the same.
    eff[1, 0, 1, POWER, :3] = np.log([0.3, 0.25, 0.45])
    arrays = pair(pre_logits=pre, eff_logits=eff)
    arrays["eff_pred"] = eff.argmax(-1)[None]
    argmax = decoding.decode(arrays, COHERENT)
    assert argmax.eff_pred[0, 1, 1, 2, OPEN] == TRUE
    thresholded = decoding.decode(arrays, dataclasses.replace(COHERENT, state_threshold=0.5))
    assert thresholded.eff_pred[0, 1, 1, 2, OPEN] == 0
    found = assert_backed(thresholded)
    assert (found.entity, found.evidence, found.breakpoint) == (0, 1, 3)
    # Above the threshold nothing changes.
    kept = decoding.decode(arrays, dataclasses.replace(COHERENT, state_threshold=0.35))
    assert kept.eff_pred[0, 1, 1, 2, OPEN] == TRUE
    # Independent decoding ignores the decoding options.
    independent = decoding.decode(arrays, dataclasses.replace(DecodingConfig(),
                                                              state_threshold=0.5))
    assert independent.eff_pred[0, 1, 1, 2, OPEN] == TRUE


def test_alias_groups_join_names_inside_one_another():
    groups = decoding.alias_groups(["TV", "John's tv", "John", "remote", "John TV", ""])
    # "john" is inside "john's tv", so John joins the TV group; the empty name stays alone.
    assert groups.tolist() == [0, 0, 0, 3, 0, 5]
    assert decoding.alias_groups(["cup", "plate"]).tolist() == [0, 1]
    padded = decoding.alias_array([[["TV", "tv stand"], ["lamp"]]], entities=3)
    assert padded.tolist() == [[[0, 0, 2], [0, 1, 2]]]


def test_an_object_named_twice_keeps_its_states_under_its_most_probable_name():
    eff = confident({(1, 0, 1, POWER): TRUE, (1, 1, 1, POWER): TRUE, (1, 1, 2, OPEN): TRUE,
                     (0, 0, 1, POWER): TRUE, (0, 1, 1, POWER): TRUE})
    eff[1, 1, 1, POWER, TRUE] = 9.0  # entity 1 is surer of it
    pre = confident({(1, 0, 3, POWER): FALSE})
    arrays = pair(pre_logits=pre, eff_logits=eff)
    arrays[decoding.ALIAS_KEY] = np.array([[[0, 1], [0, 0]]])  # aliases in story 1 only
    config = dataclasses.replace(COHERENT, alias_states=True)
    decoded = decoding.decode(arrays, config)
    found = assert_backed(decoded)
    # Story 1: the backing cell (entity 0) is kept although its alias is surer; entity 1 keeps
    # its own surer state and its state no alias shares.
    assert (found.story, found.entity) == (1, 0)
    assert decoded.eff_pred[0, 1, 0, 1, POWER] == TRUE
    assert decoded.eff_pred[0, 1, 1, 1, POWER] == TRUE
    assert decoded.eff_pred[0, 1, 1, 2, OPEN] == TRUE
    # Away from the backing cells, the less probable name loses its state: at sentence 2 both
    # names are open, entity 0 the surer.
    eff2 = eff.copy()
    eff2[1, 0, 2, OPEN] = eff[1, 1, 2, OPEN]
    eff2[1, 0, 2, OPEN, TRUE] = 9.0
    arrays2 = pair(pre_logits=pre, eff_logits=eff2)
    arrays2[decoding.ALIAS_KEY] = arrays[decoding.ALIAS_KEY]
    decoded2 = decoding.decode(arrays2, config)
    assert decoded2.eff_pred[0, 1, 0, 2, OPEN] == TRUE
    assert decoded2.eff_pred[0, 1, 1, 2, OPEN] == 0
    assert decoding.decode(arrays2, COHERENT).eff_pred[0, 1, 1, 2, OPEN] == TRUE
    # Story 0 has no aliases: both names keep their states.
    assert decoded.eff_pred[0, 0, 0, 1, POWER] == decoded.eff_pred[0, 0, 1, 1, POWER] == TRUE
    with pytest.raises(KeyError, match="alias_states needs"):
        decoding.decode(pair(pre_logits=pre, eff_logits=eff), config)


def test_every_decoding_option_is_a_config_key_off_by_default():
    from configs import base

    config = DecodingConfig.from_mapping(base.get_config().decoding)
    assert config == DecodingConfig()
    assert config.conflict_state_threshold == 0.0
    assert sorted(base.get_config().decoding) == sorted(
        f.name for f in dataclasses.fields(DecodingConfig))


def test_configs_without_the_state_options_read_as_their_defaults():
    old = {"method": "coherent", "detector_weight": 0.0, "persistence": True}
    assert DecodingConfig.from_mapping(old) == COHERENT


def test_bad_decoding_settings_are_refused():
    with pytest.raises(ValueError, match="decoding.method: unknown value 'joint'"):
        DecodingConfig(method="joint")
    with pytest.raises(ValueError, match="detector_weight"):
        DecodingConfig(method="coherent", detector_weight=-1)
    with pytest.raises(KeyError, match="persistance"):
        DecodingConfig.from_mapping({"method": "coherent", "persistance": False})
    for key in ("state_threshold", "conflict_state_threshold"):
        for threshold in (-0.1, 1.0):
            with pytest.raises(ValueError, match=key):
                DecodingConfig(method="coherent", **{key: threshold})
    with pytest.raises(KeyError, match="coherent decoding needs"):
        decoding.decode({"story_pred": np.zeros(1)}, COHERENT)


def test_the_explanations_states_need_the_conflict_state_threshold():
    eff = confident({(1, 0, 1, POWER): TRUE, (1, 1, 1, OPEN): TRUE, (1, 1, 2, OPEN): TRUE})
    pre = confident({(1, 0, 3, POWER): FALSE, (1, 1, 3, OPEN): TRUE})
    # At the evidence and the breakpoint, entity 1's states are believed at 0.6 only; the same
    # belief at sentence 2 (not part of the explanation) is kept.
    for logits, s in ((eff, 1), (pre, 3), (eff, 2)):
        logits[1, 1, s, OPEN, :3] = np.log([0.3, 0.1, 0.6])
    arrays = pair(pre_logits=pre, eff_logits=eff)
    config = dataclasses.replace(COHERENT, conflict_state_threshold=0.7)
    decoded = decoding.decode(arrays, config)
    found = assert_backed(decoded)
    assert (found.entity, found.evidence, found.breakpoint) == (0, 1, 3)
    assert decoded.eff_pred[0, 1, 1, 1, OPEN] == 0 and decoded.pre_pred[0, 1, 1, 3, OPEN] == 0
    assert decoded.eff_pred[0, 1, 1, 2, OPEN] == TRUE
    plain = decoding.decode(arrays, COHERENT)
    assert plain.eff_pred[0, 1, 1, 1, OPEN] == TRUE and plain.pre_pred[0, 1, 1, 3, OPEN] == TRUE
    # Only the evidence's effects and the breakpoint's preconditions are read that way.
    np.testing.assert_array_equal(decoded.pre_pred[0, :, :, :3], plain.pre_pred[0, :, :, :3])


def test_an_improbable_contradiction_leaves_the_states_as_the_heads_read_them():
    eff = confident({(1, 0, 1, POWER): TRUE})
    pre = confident({})
    # The flip's precondition at sentence 3 is believed at 0.3 only: exp s(c) is about 0.3.
    pre[1, 0, 3, POWER, :3] = np.log([0.6, 0.3, 0.1])
    arrays = pair(pre_logits=pre, eff_logits=eff)
    backed = decoding.decode(arrays, COHERENT)
    found = assert_backed(backed)
    assert (found.entity, found.evidence, found.breakpoint, found.attribute) == (0, 1, 3, POWER)
    assert backed.pre_pred[0, 1, 0, 3, POWER] == FALSE
    for threshold, writes in ((0.2, True), (0.5, False)):
        decoded = decoding.decode(arrays, dataclasses.replace(COHERENT,
                                                              min_flip_probability=threshold))
        # The same story and conflicting pair either way.
        assert decoded.story_pred[0] == backed.story_pred[0]
        np.testing.assert_array_equal(decoded.conflict_prob, backed.conflict_prob)
        assert (decoded.pre_pred[0, 1, 0, 3, POWER] == FALSE) == writes
        assert (decoded.contradictions[0] is not None) == writes
    assert decoded.pre_pred[0, 1, 0, 3, POWER] == 0  # the head's own argmax
    with pytest.raises(ValueError, match="min_flip_probability"):
        DecodingConfig(method="coherent", min_flip_probability=1.0)


def test_records_of_the_old_decoding_names_read_under_todays_names():
    # Issue 45 stage 3 renamed decoding "reference" to "independent" and decoding.conflict_weight
    # to detector_weight; saved records (results/) keep the old names and read as the new ones.
    from trip_jax.training.metric_log import current_names
    old = {"step": 4, "reference/accuracy": 0.5, "coherent/accuracy": 0.75,
           "decoding": "reference", "loss/total": 1.0,
           "by_decoding": {"reference": {"correct": True}},
           "sweep": {"decoding": {"method": "reference", "conflict_weight": 0.0}}}
    assert current_names([old]) == [{
        "step": 4, "independent/accuracy": 0.5, "coherent/accuracy": 0.75,
        "decoding": "independent", "loss/total": 1.0,
        "by_decoding": {"independent": {"correct": True}},
        "sweep": {"decoding": {"method": "independent", "detector_weight": 0.0}}}]
    new = {"independent/accuracy": 0.5, "decoding": "coherent", "scheme": "reference"}
    assert current_names(new) == new
