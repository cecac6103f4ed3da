"""Seed ensembles (trip_jax/evaluation/ensemble.py): averaging members' beliefs, the fit checks,
and ``--members`` in evaluate and predict on tiny runs.

The end-to-end tests use the tiny run trained once per session (conftest's ``trained_workdir``)
and a second one trained here with another seed.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from trip_jax import run_summary, score
from trip_jax.config.sections import DecodingConfig
from trip_jax.config.typed import typed
from trip_jax.data import batch_contract, input_pipeline, schema
from trip_jax.evaluation import decoding, ensemble, evaluate, metrics, predict

pytestmark = pytest.mark.usefixtures("compilation_cache")
COHERENT = DecodingConfig(method="coherent", min_flip_probability=0.5)


def outputs(seed: int, pairs: int = 3, entities: int = 2, sentences: int = 4,
            real_entities: int = 2) -> evaluate.Predictions:
    """Random eval-step outputs of ``pairs`` pairs as the Evaluator gives them."""
    rng = np.random.default_rng(seed)
    shape = (pairs, 2, entities, sentences)
    row_mask = np.zeros(shape, bool)
    row_mask[:, :, :real_entities, :] = True
    row_mask[0, 1, :, -1] = False
    logits = {}
    for key in ("pre_logits", "eff_logits"):
        value = rng.normal(0, 2, (*shape, schema.NUM_ATTRIBUTES, schema.MAX_CLASSES))
        classes = np.arange(schema.MAX_CLASSES) >= np.asarray(schema.NUM_CLASSES)[:, None]
        logits[key] = np.where(classes, -1e9, value).astype(np.float32)
    conflict_logits = rng.normal(0, 2, shape).astype(np.float32)
    conflict_prob = 1 / (1 + np.exp(-conflict_logits)) * row_mask
    story_logits = -conflict_prob.sum(axis=(2, 3)) / 2
    arrays = {
        **logits, "conflict_logits": conflict_logits, "conflict_prob": conflict_prob,
        "pre_pred": np.where(row_mask[..., None], logits["pre_logits"].argmax(-1), 0),
        "eff_pred": np.where(row_mask[..., None], logits["eff_logits"].argmax(-1), 0),
        "story_logits": story_logits, "story_pred": story_logits.argmax(-1),
        "row_mask": row_mask, "pre_label": np.zeros((*shape, schema.NUM_ATTRIBUTES), np.int32),
        "eff_label": np.zeros((*shape, schema.NUM_ATTRIBUTES), np.int32),
        "conflict_label": np.zeros(shape, np.int32),
        "story_label": np.arange(pairs, dtype=np.int32) % 2,
        "pair_mask": np.ones(pairs, bool), "pair_index": np.arange(pairs, dtype=np.int32),
        decoding.ALIAS_KEY: np.tile(np.arange(entities), (pairs, 2, 1))}
    return evaluate.Predictions(arrays, {"total": 1.0})


def softmax(x):
    return np.exp(decoding.log_softmax(x))


def test_one_member_is_the_model_itself_and_copies_decode_as_it():
    member = outputs(0)
    assert ensemble.average([member]) is member
    averaged = ensemble.average([member, member])
    for config in (COHERENT, DecodingConfig()):
        alone, mean = (decoding.decode(p.arrays, config) for p in (member, averaged))
        for key, value in alone.predictions().items():
            np.testing.assert_allclose(getattr(mean, key), value, atol=1e-6, err_msg=key)
        assert alone.contradictions == mean.contradictions
    assert averaged.losses == {}


def test_the_average_is_of_probabilities_with_entities_padded():
    small, large = outputs(1, entities=2), outputs(2, entities=3)
    averaged = ensemble.average([small, large]).arrays
    assert averaged["row_mask"].shape == (3, 2, 3, 4)
    real = small.arrays["row_mask"]
    for key in ("pre_logits", "eff_logits"):
        want = (softmax(small.arrays[key]) + softmax(large.arrays[key][:, :, :2])) / 2
        np.testing.assert_allclose(softmax(averaged[key][:, :, :2]), want, atol=1e-6)
        assert (softmax(averaged[key][:, :, :2])[..., schema.MAX_CLASSES - 1][
            ..., np.asarray(schema.NUM_CLASSES) < schema.MAX_CLASSES] < 1e-12).all()
        pred = key.replace("logits", "pred")
        np.testing.assert_array_equal(averaged[pred][:, :, :2],
                                      np.where(real[..., None], want.argmax(-1), 0))
    sigmoid = lambda x: 1 / (1 + np.exp(-np.asarray(x, np.float64)))  # noqa: E731
    want = (sigmoid(small.arrays["conflict_logits"])
            + sigmoid(large.arrays["conflict_logits"][:, :, :2])) / 2
    np.testing.assert_allclose(sigmoid(averaged["conflict_logits"][:, :, :2]), want, atol=1e-9)
    np.testing.assert_allclose(averaged["conflict_prob"][:, :, :2], np.where(real, want, 0))
    np.testing.assert_allclose(
        averaged["story_logits"], (small.arrays["story_logits"] + large.arrays["story_logits"]) / 2)
    np.testing.assert_array_equal(averaged["story_pred"], averaged["story_logits"].argmax(-1))
    assert set(averaged) >= {*batch_contract.PREDICTION_KEYS, *batch_contract.LOGIT_KEYS}


def test_one_vote_builder_reads_a_scored_record_and_decoded_outputs():
    record = {"predicted_story": 1, "predicted_conflict": [0, 2], "correct": True,
              "consistent": False, "verifiable": False, "label": 1}
    scored = ensemble.scored_choice(record)
    assert scored == {"story": 1, "conflict": [0, 2], "correct": True, "consistent": False,
                      "verifiable": False}
    conflict = np.zeros((1, 2, 2, 3))
    conflict[0, 0, 1, 0] = conflict[0, 0, 0, 2] = 0.5  # story 0: the other story of story 1
    conflict[0, 1, 0, 1] = 0.9  # the chosen story's own beliefs are no vote
    decoded = decoding.Decoded(np.array([1]), conflict, None, None, [None])
    assert ensemble.decoded_choice(decoded, 0) == {"story": 1, "conflict": [0, 2]}
    both = ensemble.votes(["a", "b"], [scored, ensemble.decoded_choice(decoded, 0)])
    assert [m["name"] for m in both["members"]] == ["a", "b"] and both["members_agree"]
    assert both["members"][1] == {"name": "b", "story": 1, "conflict": [0, 2]}
    other = ensemble.votes(["a", "b"], [scored, {"story": 1, "conflict": [0]}])
    assert not other["members_agree"]
    with pytest.raises(ValueError):
        ensemble.votes(["a"], [scored, scored])


def test_members_run_on_other_pairs_are_refused():
    first, other = outputs(3), outputs(4)
    other.arrays["story_label"] = 1 - other.arrays["story_label"]
    with pytest.raises(ensemble.EnsembleError,
                       match=r"^member b was run on other pairs than member a \(story_label"):
        ensemble.average([first, other], ["a", "b"])


def test_a_member_of_another_split_or_label_space_is_refused_in_one_line(tiny_config):
    config = typed(tiny_config())
    first = ensemble.fit_signature(config, "dev_train")
    ensemble.check_fit("b", ensemble.fit_signature(config, "dev_train"), "a", first)
    with pytest.raises(ensemble.EnsembleError) as error:
        ensemble.check_fit("b", ensemble.fit_signature(config, "dev_all"), "a", first)
    assert str(error.value) == ("member b does not fit the ensemble: protocol 'dev_all' "
                                "(member a: 'dev_train')")
    c = tiny_config()
    c.data.max_sentences = 6
    other = typed(c)
    with pytest.raises(ensemble.EnsembleError, match=r"data.max_sentences 6 \(member a: 7\)"):
        ensemble.check_fit("b", ensemble.fit_signature(other, "dev_train"), "a", first)
    with pytest.raises(ensemble.EnsembleError,
                       match=r"^member runs/../runs/w1 is given twice \(also as runs/w1\)$"):
        ensemble.check_members(["runs/w1", "runs/w2", "runs/../runs/w1"])


@pytest.fixture(scope="module")
def second_member(tmp_path_factory, tiny_config):
    """A tiny run like conftest's ``trained_workdir`` with seed 23."""
    from trip_jax import train

    workdir = tmp_path_factory.mktemp("ensemble") / "seed23"
    config = tiny_config()
    config.train.num_epochs = 1
    config.train.seed = 23
    train.train_and_evaluate(config, str(workdir))
    return workdir


@pytest.fixture(scope="module")
def copies(trained_workdir, tmp_path_factory):
    """Two copies of the trained tiny run (an ensemble of equal members)."""
    root = tmp_path_factory.mktemp("copies")
    for name in ("a", "b"):
        shutil.copytree(trained_workdir, root / name)
    return root / "a", root / "b"


def test_an_ensemble_of_equal_members_scores_as_the_member(copies, tiny_config, tmp_path):
    alone = ensemble.evaluate_members(tiny_config(), str(copies[0]))
    result = ensemble.evaluate_members(tiny_config(), tmp_path,
                                       members=[str(c) for c in copies])
    for key in (*metrics.TIER_METRICS, "precondition_f1", "effect_f1", "conflict_f1"):
        assert result["metrics"][key] == alone["metrics"][key], key
    records = [json.loads(line) for line in
               result["paths"]["predictions"].read_text().splitlines()]
    single = [json.loads(line) for line in
              alone["paths"]["predictions"].read_text().splitlines()]
    assert [r["predicted_conflict"] for r in records] == [r["predicted_conflict"] for r in single]
    assert all(r["members_agree"] for r in records)
    assert [m["workdir"] for m in result["members"]] == ["a", "b"]


def test_a_lone_member_is_the_model_itself(trained_workdir, tiny_config, tmp_path):
    own = ensemble.evaluate_members(tiny_config(), str(trained_workdir))
    lone = ensemble.evaluate_members(tiny_config(), tmp_path, members=[str(trained_workdir)])
    assert lone["paths"]["json"].name == own["paths"]["json"].name == "test.selected-4.json"
    assert lone["paths"]["json"].parent == tmp_path / "eval"
    report = json.loads(lone["paths"]["json"].read_text())
    assert "members" not in report and report["checkpoint_step"] == 4
    assert report == json.loads(own["paths"]["json"].read_text())
    records = lone["paths"]["predictions"].read_text()
    assert records == own["paths"]["predictions"].read_text() and '"members' not in records
    assert [(m["workdir"], m["checkpoint"]) for m in lone["members"]] == [
        (trained_workdir.name, "selected")]


def test_evaluate_with_members_writes_the_ensemble_report(trained_workdir, second_member,
                                                          tiny_config, tmp_path, run_main,
                                                          data_dir):
    members = [str(trained_workdir), str(second_member)]
    result = run_main(f"--workdir={tmp_path}", "--mode=evaluate",
                      f"--members={','.join(members)}")
    assert result.returncode == 0, result.stderr[-3000:]
    stem = tmp_path / "eval" / "test.ensemble-2-selected"
    report = json.loads(stem.with_name(stem.name + ".json").read_text())
    names = ["random bert (paper, seed 22)", "random bert (paper, seed 23)"]
    assert report["model"] == f"ensemble of 2 ({', '.join(names)})"
    assert [m["name"] for m in report["members"]] == names
    # Each member's tiers are those of its own evaluation.
    for member, facts in zip(members, report["members"]):
        own = ensemble.evaluate_members(tiny_config(), member)["metrics"]
        for key in metrics.TIER_METRICS:
            assert facts["metrics"][key] == own[key], (member, key)
    spread = report["members_spread"]["accuracy"]
    values = [m["metrics"]["accuracy"] for m in report["members"]]
    assert (spread["min"], spread["max"]) == (min(values), max(values))

    records = [json.loads(line) for line in
               (tmp_path / "eval" / "test.ensemble-2-selected.predictions.jsonl")
               .read_text().splitlines()]
    assert len(records) == report["metrics"]["num_pairs"] == 8
    for record in records:
        votes = record["members"]
        assert [v["name"] for v in votes] == names
        assert record["members_agree"] == (len({(v["story"], tuple(v["conflict"]))
                                                for v in votes}) == 1)
    assert report["members_agree"] == sum(r["members_agree"] for r in records)
    markdown = stem.with_name(stem.name + ".md").read_text()
    assert "## Ensemble members (2)" in markdown and "members' mean (min–max)" in markdown
    page = (tmp_path / "eval" / "test.ensemble-2-selected.html").read_text()
    assert 'id="f-members"' in page and '"agr":' in page

    # trip_jax.score and trip_jax.run_summary read the ensemble like any run.
    pairs = input_pipeline.split_pairs(input_pipeline.load_splits(typed(tiny_config()).data),
                                       "test")
    text = (tmp_path / "eval" / "test.ensemble-2-selected.predictions.jsonl").read_text()
    scored = score.score_predictions(text, pairs)
    for key in metrics.TIER_METRICS:
        assert scored.scores[key] == report["metrics"][key]
    summary = run_summary.summarize([stem.with_name(stem.name + ".json")], data_dir)
    assert summary["runs"][0]["test"][report["metrics"]["decoding"]]["accuracy"] == \
        report["metrics"]["accuracy"]


def test_members_that_cannot_join_are_refused_in_one_line(trained_workdir, tmp_path, run_main):
    missing = tmp_path / "never_trained"
    result = run_main(f"--workdir={tmp_path / 'out'}", "--mode=evaluate",
                      f"--members={trained_workdir},{missing}")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: no checkpoint") and str(missing) in lines[-1]
    result = run_main(f"--workdir={tmp_path / 'out'}", "--mode=train",
                      f"--members={trained_workdir}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --members: --mode=train does not read it (only --mode=evaluate and "
        "--mode=predict)")


def test_predict_with_members_lists_their_votes(copies, trained_workdir, tmp_path, tiny_config):
    path = tmp_path / "pairs.jsonl"
    phone = {"id": "phone", "stories": [
        ["Tom charged the phone.", "Tom went to work.", "Tom called Ann with the phone."],
        ["Tom charged the phone.", "Tom dropped the phone in the lake.",
         "Tom called Ann with the phone."]],
        "entities": [["phone", "Tom"], ["phone", "Tom", "lake"]]}
    path.write_text(json.dumps(phone) + "\n")
    alone = predict.predict_file(tiny_config(), str(trained_workdir), str(path),
                                 str(tmp_path / "alone.jsonl"))
    both = predict.predict_file(tiny_config(), str(tmp_path), str(path),
                                str(tmp_path / "both.jsonl"), members=[str(c) for c in copies])
    (answer,), (single,) = both["answers"], alone["answers"]
    assert answer["text"] == single["text"]
    assert answer["plausible_story"] == single["plausible_story"]
    assert [m["story"] for m in answer["members"]] == [single["plausible_story"]] * 2
    assert answer["members_agree"]
    assert "members" not in single and "members_agree" not in single
    lone = predict.predict_file(tiny_config(), str(tmp_path), str(path),
                                str(tmp_path / "lone.jsonl"), members=[str(copies[0])])
    assert (tmp_path / "lone.jsonl").read_text() == (tmp_path / "alone.jsonl").read_text()
    page = (tmp_path / "both.html").read_text()
    assert 'id="f-members"' in page
