"""Cross-validation on configs/tiny.py: every fold trains in its own workdir, finished folds are
skipped, the summary holds every epoch's held-out scores over folds, each fold's decoding sweep
is written as the fold ends and summarised from those files alone; and the dev_all protocol
(the last step is the model)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from trip_jax import cross_validate, train
from trip_jax.config import sweeps
from trip_jax.config.messages import ConfigError
from trip_jax.config.typed import typed
from trip_jax.training import checkpoints

pytestmark = pytest.mark.usefixtures("compilation_cache")


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


SWEEP = "method=independent,coherent"


def two_folds(tiny_config, sweep=SWEEP):
    config = tiny_config()
    config.data.folds = 2
    config.cv.sweep = sweep
    return config


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory, tiny_config):
    """Two folds of the tiny config, swept over the decoding method; (workdir, summary)."""
    workdir = tmp_path_factory.mktemp("cv")
    return workdir, cross_validate.cross_validate(two_folds(tiny_config), str(workdir))


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
    config = two_folds(tiny_config)

    def no_training(*args):
        raise AssertionError("a finished fold was trained again")

    monkeypatch.setattr(train, "train_and_evaluate", no_training)
    assert cross_validate.cross_validate(config, str(workdir)) == summary


def test_summary_of_a_damaged_log_names_the_file(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "split": "dev_fold", "epoch": 1.0}\n{"step": 2,\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        cross_validate.finished(tmp_path)


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


def test_each_fold_writes_its_sweep_and_the_summary_reads_those_files(cv_run):
    workdir, summary = cv_run
    swept = json.loads((workdir / "cv_sweep.json").read_text())
    assert swept["folds"] == [0, 1]
    # The tiny run decodes with "independent": its row is each fold's last held-out evaluation.
    last = summary["epochs"][2.0]
    reference, coherent = swept["decodings"]["method=independent"], swept["decodings"][
        "method=coherent"]
    for name in ("accuracy", "consistency", "verifiability", "curated/accuracy"):
        assert reference[name]["mean"] == pytest.approx(last[name]["mean"])
    assert coherent["accuracy"]["mean"] == pytest.approx(last["coherent/accuracy"]["mean"])
    for fold in (0, 1):
        held = json.loads((workdir / f"fold{fold}" / "sweep.json").read_text())
        assert held["method=coherent"]["decoding"]["method"] == "coherent"
        assert held["method=independent"]["step"] == 4  # 4 pairs at batch 2, 2 epochs
    table = (workdir / "cv_sweep.md").read_text()
    assert "| method=coherent | 2 |" in table and "| method=independent | 2 |" in table


def test_committed_fold_files_are_enough_without_checkpoints(cv_run, tiny_config, tmp_path,
                                                             monkeypatch):
    workdir, summary = cv_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("checkpoints", "cv_*"))
    monkeypatch.setattr(train, "train_and_evaluate", None)  # nothing may train
    assert cross_validate.cross_validate(two_folds(tiny_config), str(copy)) == summary
    assert (json.loads((copy / "cv_sweep.json").read_text())
            == json.loads((workdir / "cv_sweep.json").read_text()))
    # The fold folders alone (no config): the same summaries, every decoding they all hold.
    (copy / "cv_sweep.json").unlink()
    assert cross_validate.summarise_folds(str(copy), 2) == summary
    assert (json.loads((copy / "cv_sweep.json").read_text())
            == json.loads((workdir / "cv_sweep.json").read_text()))
    # A decoding the files lack needs a checkpoint: one line naming the fold to train again.
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"fold0/sweep.json lacks cv.sweep's method=independent, "
                             r"persistence=False .*remove .*fold0 to train that fold again"):
        cross_validate.cross_validate(
            two_folds(tiny_config, SWEEP + ";persistence=false"), str(copy))


def test_sweep_files_written_under_the_old_names_are_read_without_decoding_again(
        cv_run, tiny_config, tmp_path, monkeypatch):
    """A fold's sweep.json from before issue 45's renames (label method=reference, decoding
    method "reference", key conflict_weight) still holds cv.sweep's method=independent."""
    workdir, summary = cv_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("checkpoints", "cv_*"))
    for fold in (0, 1):
        path = copy / f"fold{fold}" / "sweep.json"
        old = {}
        for label, record in json.loads(path.read_text()).items():
            decoding = {("conflict_weight" if k == "detector_weight" else k): v
                        for k, v in record["decoding"].items()}
            if decoding["method"] == "independent":
                decoding["method"] = "reference"
            old[label.replace("method=independent", "method=reference")] = {
                **record, "decoding": decoding}
        assert "method=reference" in old
        path.write_text(json.dumps(old))
    monkeypatch.setattr(train, "train_and_evaluate", None)  # nothing may train or decode
    assert cross_validate.cross_validate(two_folds(tiny_config), str(copy)) == summary
    assert (json.loads((copy / "cv_sweep.json").read_text())
            == json.loads((workdir / "cv_sweep.json").read_text()))


def test_a_fold_without_its_sweep_file_is_decoded_from_its_checkpoint(cv_run, tiny_config,
                                                                       tmp_path, monkeypatch):
    workdir, _ = cv_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    (copy / "fold1" / "sweep.json").unlink()
    monkeypatch.setattr(train, "train_and_evaluate", None)
    cross_validate.cross_validate(two_folds(tiny_config), str(copy))
    assert (json.loads((copy / "fold1" / "sweep.json").read_text())
            == json.loads((workdir / "fold1" / "sweep.json").read_text()))


@pytest.mark.parametrize("text, message", [
    ("conflict_state_threshold=0,1.5", "decoding.conflict_state_threshold in [0, 1), not '1.5'"),
    ("alias_states=maybe", "decoding.alias_states a bool, not 'maybe'"),
    ("state_threshold=", "with each KEY one of method, detector_weight"),
    ("learning_rate=1", "'learning_rate=1' is not"),
    ("method=independent;method=coherent", "decoding.method is named twice"),
])
def test_bad_sweeps_are_one_line_naming_the_key(text, message, tiny_config):
    with pytest.raises(ValueError, match=re.escape(message)):
        sweeps.parse(text)
    config = tiny_config()
    config.cv.sweep = text
    with pytest.raises(ConfigError, match=re.escape(
            f"bad value for --config.cv.sweep: {text!r} (allowed: ")):
        typed(config)


def test_sweeps_cross_their_keys_in_order():
    crossed = sweeps.combinations("min_flip_probability=0,0.9;conflict_state_threshold=0.9,0.95")
    assert [sweeps.label(c) for c in crossed] == [
        "min_flip_probability=0, conflict_state_threshold=0.9",
        "min_flip_probability=0, conflict_state_threshold=0.95",
        "min_flip_probability=0.9, conflict_state_threshold=0.9",
        "min_flip_probability=0.9, conflict_state_threshold=0.95"]
    assert sweeps.combinations("") == [{}]
