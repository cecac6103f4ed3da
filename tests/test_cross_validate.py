"""Cross-validation on configs/tiny.py: every fold trains in its own workdir, finished folds are
skipped, the summary holds every epoch's held-out scores over folds; and the dev_all protocol
(the last step is the model)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from trip_jax import cli, cross_validate, train
from trip_jax.evaluation import cv_summary

pytestmark = pytest.mark.usefixtures("compilation_cache")


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory, tiny_config):
    """Two folds of the tiny config; (workdir, summary)."""
    workdir = tmp_path_factory.mktemp("cv")
    config = tiny_config()
    config.data.folds = 2
    return workdir, cross_validate.cross_validate(config, str(workdir))


def test_every_fold_trains_apart_and_never_reads_test(cv_run):
    workdir, _ = cv_run
    held_out_ids = []
    for fold in (0, 1):
        log = read_log(workdir / f"fold{fold}" / "metrics.jsonl")
        assert {r["split"] for r in log} == {"train", "dev_fold", "wall_time"}  # no test
        held = [r for r in log if r["split"] == "dev_fold"]
        assert [r["epoch"] for r in held] == [1.0, 2.0]
        assert all(r["curated/num_pairs"] + r["implicit/num_pairs"] == 4 for r in held)
        saved = json.loads((workdir / f"fold{fold}" / "config.json").read_text())
        assert saved["data"]["protocol"] == "dev_cv" and saved["data"]["fold"] == fold
        assert not (workdir / f"fold{fold}" / "reports").exists()
        held_out_ids.append(cross_validate.finished(str(workdir / f"fold{fold}")))
    assert held_out_ids == [True, True]


def test_summary_is_the_mean_and_spread_over_folds(cv_run):
    workdir, summary = cv_run
    logs = {f: read_log(workdir / f"fold{f}" / "metrics.jsonl") for f in (0, 1)}
    last = {f: [r for r in logs[f] if r["split"] == "dev_fold"][-1] for f in (0, 1)}
    stats = summary["epochs"][2.0]["effect_f1"]
    values = [last[0]["effect_f1"], last[1]["effect_f1"]]
    assert stats["mean"] == pytest.approx(np.mean(values))
    assert stats["std"] == pytest.approx(np.std(values, ddof=1))
    assert (stats["min"], stats["max"], stats["n"]) == (min(values), max(values), 2)
    assert "curated/accuracy" in summary["epochs"][2.0]
    written = json.loads((workdir / "cv_summary.json").read_text())
    assert written["epochs"]["2.0"]["effect_f1"]["mean"] == pytest.approx(stats["mean"])
    table = (workdir / "cv_summary.md").read_text()
    assert f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}" in table


def test_a_second_call_skips_the_finished_folds(cv_run, tiny_config, monkeypatch):
    workdir, summary = cv_run
    config = tiny_config()
    config.data.folds = 2

    def no_training(*args):
        raise AssertionError("a finished fold was trained again")

    monkeypatch.setattr(train, "train_and_evaluate", no_training)
    assert cross_validate.cross_validate(config, str(workdir)) == summary


def test_summary_of_a_damaged_log_names_the_file(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "split": "dev_fold", "epoch": 1.0}\n{"step": 2,\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        cv_summary.read_log(log)


def test_dev_all_trains_on_all_pairs_and_scores_the_last_step(tmp_path, tiny_config):
    config = tiny_config()
    config.data.protocol = "dev_all"
    result = train.train_and_evaluate(config, str(tmp_path))
    log = read_log(tmp_path / "metrics.jsonl")
    assert {r["split"] for r in log} == {"train", "test", "wall_time"}  # no selection split
    assert [r["checkpoint"] for r in log if r["split"] == "test"] == ["selected"]
    report = json.loads((tmp_path / "reports" / "test.json").read_text())
    # 8 dev pairs at batch 2, 2 epochs: the selected checkpoint is the last step.
    assert report["protocol"] == "dev_all" and report["checkpoint_step"] == 8
    assert report["metrics"]["accuracy"] == pytest.approx(result["accuracy"])
    assert not (tmp_path / "reports" / "best_accuracy").exists()


def test_sweep_scores_each_fold_as_its_own_held_out_evaluation(cv_run, tiny_config):
    workdir, summary = cv_run
    config = tiny_config()
    config.data.folds = 2
    key, values = cross_validate.parse_sweep("method=reference,coherent", config)
    assert (key, values) == ("decoding.method", ["reference", "coherent"])
    swept = cross_validate.sweep_decoding(config, str(workdir), key, values)
    # The tiny run decodes with "reference": its row is each fold's last held-out evaluation.
    last = summary["epochs"][2.0]
    for name in ("accuracy", "consistency", "verifiability", "curated/accuracy"):
        assert swept["values"]["reference"][name]["mean"] == pytest.approx(last[name]["mean"])
    assert swept["values"]["coherent"]["accuracy"]["mean"] == pytest.approx(
        last["coherent/accuracy"]["mean"])
    table = (workdir / "cv_sweep.method.md").read_text()
    assert "| coherent | 2 |" in table and "| reference | 2 |" in table


@pytest.mark.parametrize("text, message", [
    ("conflict_state_threshold=0,1.5", "bad value for --config.decoding.conflict_state_threshold: "
                                       "'1.5' (allowed: in [0, 1))"),
    ("alias_states=maybe", "'maybe' (allowed: a bool)"),
    ("state_threshold=", "expected KEY=V1,V2,..."),
    ("learning_rate=1", "expected KEY=V1,V2,... with KEY one of method, conflict_weight"),
])
def test_bad_sweeps_are_one_line(text, message, tiny_config):
    with pytest.raises(cli.UsageError, match=re.escape(message)):
        cross_validate.parse_sweep(text, tiny_config())


def test_a_sweep_scores_the_finished_folds_and_names_the_others(cv_run, tiny_config, tmp_path):
    workdir, summary = cv_run
    partial = tmp_path / "partial"
    shutil.copytree(workdir, partial)
    log = partial / "fold1" / "metrics.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if json.loads(line)["split"] != "wall_time"))  # fold 1 cut short
    config = tiny_config()
    config.data.folds = 2
    swept = cross_validate.sweep_decoding(config, str(partial), "decoding.method", ["reference"])
    assert (swept["folds"], swept["unfinished_folds"]) == ([0], [1])
    fold0 = [r for r in read_log(workdir / "fold0" / "metrics.jsonl")
             if r["split"] == "dev_fold"][-1]
    assert swept["values"]["reference"]["accuracy"]["mean"] == pytest.approx(fold0["accuracy"])
    assert "folds [1] had not finished" in (partial / "cv_sweep.method.md").read_text()
