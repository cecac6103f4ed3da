"""The tuned recipe end to end on configs/tiny.py (train, select, report, evaluate, predict),
the recipes of the config argument, and the selection rules."""

from __future__ import annotations

import json
import shutil

import pytest

from configs import base, minilm, roberta, tiny
from trip_jax.config.sections import TrainConfig
from trip_jax import run_summary, train
from trip_jax.data import schema
from trip_jax.evaluation import ensemble, metrics, predict
from trip_jax.training import checkpoints, selection

pytestmark = pytest.mark.usefixtures("compilation_cache")


def test_the_paper_configs_run_the_paper_recipe_and_minilm_the_tuned_one():
    for config in (roberta.get_config(), tiny.get_config()):
        assert config.recipe == "paper"
        assert config.decoding.method == "independent"
        assert config.train.selection == "verifiability"
        assert config.loss.story_weight == 0.0  # omit_story, the paper's best
    tuned = minilm.get_config()
    assert tuned.recipe == "tuned"
    for dotted, value in base.RECIPES["tuned"].items():
        assert base.get_key(tuned, dotted) == value, dotted
    assert (tuned.loss.conflict_weight, tuned.loss.story_weight) == (0.2, 0.0)  # omit_story
    # The paper's model is one switch away, and the tuned recipe is one switch for any encoder.
    paper = minilm.get_config("recipe=paper")
    assert paper.decoding.method == "independent"
    assert paper.model.tiered.detector_layers == 6
    assert roberta.get_config("recipe=tuned").decoding.method == "coherent"
    assert roberta.get_config("recipe=tuned").data.max_length == 16  # still exact fidelity
    assert minilm.get_config("recipe=tuned,losses=omit_story").loss.story_weight == 0.0
    with pytest.raises(ValueError, match="names recipe twice"):
        minilm.get_config("recipe=tuned,recipe=paper")
    with pytest.raises(ValueError, match="did you mean recipe=tuned"):
        minilm.get_config("tuned")
    with pytest.raises(ValueError, match="unknown recipe 'coherent'"):
        minilm.get_config("recipe=coherent")


def test_selection_rules():
    history = [{"consistency": 0.2, "verifiability": 0.1},
               {"consistency": 0.4, "verifiability": 0.0}]
    assert selection.selection_score(history, "verifiability", 2) == 0.0
    assert selection.selection_score(history, "smoothed", 2) == pytest.approx(0.35)
    assert selection.selection_score(history, "smoothed", 1) == pytest.approx(0.4)
    # A partial window ranks below every full one, and partial windows still rank by their mean.
    assert selection.selection_score(history[:1], "smoothed", 3) == pytest.approx(0.3 - 2)
    assert selection.selection_score(history[:1], "smoothed", 2) < selection.selection_score(
        [{"consistency": 0.0, "verifiability": 0.0}] * 2, "smoothed", 2)
    # The rule and the window are checked once, by the schema.
    with pytest.raises(ValueError, match="train.selection: unknown value 'best'"):
        TrainConfig(selection="best")
    with pytest.raises(ValueError, match=r"train.selection_window: 0 \(allowed: >= 1\)"):
        TrainConfig(selection_window=0)
    # Checkpoints saved before the selection score existed rank by verifiability first.
    assert checkpoints.ranking_score(checkpoints.SELECTED, {
        "verifiability": 0.1, "consistency": 0.2, "accuracy": 0.5}) == (0.1, 0.1, 0.2, 0.5)


@pytest.fixture(scope="module")
def coherent_run(tmp_path_factory, tiny_config):
    """A tiny run with the tuned recipe, every decoded contradiction written (a 2-epoch tiny
    model believes none at the recipe's min_flip_probability): (workdir, config, test metrics)."""
    workdir = tmp_path_factory.mktemp("coherent")
    config = tiny_config("recipe=tuned")
    config.train.num_epochs = 2
    config.decoding.min_flip_probability = 0.0
    return workdir, config, train.train_and_evaluate(config, str(workdir))


def test_the_coherent_run_selects_and_reports_both_decodings(coherent_run):
    workdir, config, result = coherent_run
    assert result["decoding"] == "coherent"
    for method in ("independent", "coherent"):
        tiers = [result[f"{method}/{key}"] for key in metrics.TIER_METRICS]
        assert 1 >= tiers[0] >= tiers[1] >= tiers[2] >= 0
    assert result["accuracy"] == result["coherent/accuracy"]
    log = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    held_out = [r for r in log if r["split"] == "dev_holdout"]
    assert len(held_out) == 2
    scores = [r["consistency"] + r["verifiability"] for r in held_out]
    assert held_out[1]["selection_score"] == pytest.approx(sum(scores) / 2)
    selected = checkpoints.restore_for_eval(str(workdir), checkpoints.SELECTED)
    best = max(held_out, key=lambda r: (r["selection_score"], r["verifiability"],
                                         r["consistency"], r["accuracy"]))
    assert selected.step == best["step"]
    # The latest checkpoint carries the history a resumed run needs.
    latest = checkpoints.restore_for_eval(str(workdir), checkpoints.LATEST)
    assert len(latest.meta["selection_history"]) == config.train.selection_window
    report = (workdir / "reports" / "test.md").read_text()
    assert "## Decodings of the same outputs" in report
    # omit_story (the default loss preset): the independent decoding's story choice is untrained.
    assert "| independent (story choice untrained) |" in report and "| coherent |" in report
    assert "## Where pairs are lost, tier by tier" in report
    shares = result["tier_losses"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["verifiable"] == pytest.approx(result["verifiability"])


def test_every_coherent_prediction_names_the_states_behind_its_conflict(coherent_run):
    workdir, _, _ = coherent_run
    records = [json.loads(line) for line in
               (workdir / "reports" / "test.predictions.jsonl").read_text().splitlines()]
    assert records and all(r["decoding"] == "coherent" for r in records)
    backed = [r for r in records if "backing" in r["explanation"]]
    assert backed
    for record in backed:
        explanation = record["explanation"]
        backing, conflict = explanation["backing"], explanation["conflict"]
        assert backing["story"] == explanation["implausible_story"]
        assert (backing["evidence"], backing["breakpoint"]) == (conflict["evidence"],
                                                                 conflict["breakpoint"])
        assert record["predicted_conflict"] == [conflict["evidence"], conflict["breakpoint"]]
        assert {backing["effect"], backing["precondition"]} == {1, 2}
        default = schema.DEFAULT_VALUES[schema.ATTRIBUTE_INDEX[backing["attribute"]]]
        for side, sentence, label in (("effect", backing["evidence"], backing["effect"]),
                                      ("precondition", backing["breakpoint"],
                                       backing["precondition"])):
            if label != default:  # the explanation lists the nontrivial states only
                assert {"entity": backing["entity"], "sentence": sentence, "side": side,
                        "attribute": backing["attribute"], "label": label}.items() <= {
                    **next(s for s in explanation["states"] if s["side"] == side
                           and s["entity"] == backing["entity"]
                           and s["attribute"] == backing["attribute"])}.items()
        assert f"conflict: after sentence {backing['evidence'] + 1} " in explanation["text"]
        assert ", but sentence" in explanation["text"]
        assert set(record["by_decoding"]) == {"independent", "coherent"}


def test_evaluate_and_predict_decode_as_the_config_says(coherent_run, tmp_path):
    workdir, config, result = coherent_run
    scored = ensemble.evaluate_members(config, str(workdir), checkpoints.SELECTED,
                                       "test")["metrics"]
    for key in ("coherent/accuracy", "coherent/consistency", "independent/verifiability"):
        assert scored[key] == result[key], key
    as_independent = config.copy_and_resolve_references()
    as_independent.decoding.method = "independent"
    independent = ensemble.evaluate_members(as_independent, str(workdir),
                                            checkpoints.SELECTED, "test")["metrics"]
    assert independent["decoding"] == "independent"
    assert independent["accuracy"] == result["independent/accuracy"]
    stories = [["Tom plugged in the phone.", "Tom charged the phone.", "Tom called Ann."],
               ["Tom dropped the phone in water.", "The phone broke.", "Tom called Ann."]]
    line = {"id": "phone", "stories": stories, "entities": [["Tom", "phone"], ["Tom", "phone"]]}
    source = tmp_path / "pairs.jsonl"
    source.write_text(json.dumps(line) + "\n")
    answers = predict.predict_file(config, str(workdir), str(source))["answers"]
    assert len(answers) == 1
    answer = answers[0]
    assert answer["decoding"] == "coherent"
    # Every story of two sentences or more has candidates, so a contradiction is always named.
    assert answer["backing"]["story"] == answer["implausible_story"]
    assert answer["backing"]["entity"] in ("Tom", "phone")


def test_run_summary_gives_the_spread_of_finished_runs(coherent_run, tmp_path, capsys):
    workdir, _, result = coherent_run
    second = tmp_path / "seed_2"
    shutil.copytree(workdir, second, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    report = json.loads((second / "reports" / "test.json").read_text())
    report["metrics"]["coherent/accuracy"] = result["coherent/accuracy"] + 0.25
    (second / "reports" / "test.json").write_text(json.dumps(report))
    summary = run_summary.summarize([workdir, second])
    accuracy = summary["spread"]["coherent"]["accuracy"]
    assert accuracy["min"] == result["coherent/accuracy"]
    assert accuracy["max"] == pytest.approx(result["coherent/accuracy"] + 0.25)
    assert accuracy["mean"] == pytest.approx(result["coherent/accuracy"] + 0.125)
    first = summary["runs"][0]
    assert first["wall_seconds"] > 0 and first["seed"] == 22
    assert first["held_out"]["accuracy"] is not None
    assert run_summary.main(run_summary.parse_flags(
        ["run_summary", str(workdir), str(second), f"--out={tmp_path}"])) == 0
    assert "| coherent |" in (tmp_path / "summary.md").read_text()
    capsys.readouterr()
    assert run_summary.main(run_summary.parse_flags(["run_summary", str(tmp_path)])) == 1
    assert "is missing" in capsys.readouterr().err  # a directory that is not a finished run
    with pytest.raises(SystemExit) as exited:  # a path that does not exist: a usage error
        run_summary.parse_flags(["run_summary", str(tmp_path / "missing")])
    assert exited.value.code == 2 and "does not exist" in capsys.readouterr().err
