"""Scoring a saved checkpoint (--mode=evaluate) and the random baseline report, on configs/tiny.py.

One tiny run (1 epoch, 4 steps) is trained per session and shared with tests/test_predict.py
(``trained_workdir``); a persistent compilation cache, also handed to the ``main`` subprocess,
spares recompiling the eval step.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import jax
import pytest

from test_train import DATA_DIR, REPO, tiny_config
from trip_jax import checkpoints, evaluate, protocol, random_baseline, schema, train

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cache_dir(tmp_path_factory) -> pathlib.Path:
    """The session's persistent JAX compilation cache."""
    return tmp_path_factory.getbasetemp() / "jax_cache"


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """Lets every compilation after the first in this session load from disk."""
    saved = (jax.config.jax_compilation_cache_dir,
             jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir(tmp_path_factory)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def trained_workdir(tmp_path_factory) -> pathlib.Path:
    """A finished tiny run (1 epoch), trained once per session whichever module asks first."""
    workdir = tmp_path_factory.getbasetemp() / "trained_tiny"
    done = workdir / "TRAINED"
    if not done.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        config = tiny_config()
        config.train.num_epochs = 1
        train.train_and_evaluate(config, str(workdir))
        done.touch()
    return workdir


def run_main(*flags: str, cache: pathlib.Path) -> subprocess.CompletedProcess:
    """``python -m trip_jax.main`` on configs/tiny.py with the shared data and cache."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    command = [sys.executable, "-m", "trip_jax.main", "--config=configs/tiny.py",
               f"--config.data.data_dir={DATA_DIR}", *flags]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return trained_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def evaluated(workdir, tmp_path_factory):
    """``--mode=evaluate`` through the real main (absl flags), on test."""
    result = run_main(f"--workdir={workdir}", "--mode=evaluate",
                      cache=cache_dir(tmp_path_factory))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir / "eval"


def test_evaluate_mode_writes_every_report(evaluated, workdir):
    report = json.loads((evaluated / "test.json").read_text())
    best = checkpoints.restore_for_eval(str(workdir))
    assert report["checkpoint"] == "best_verifiability"
    assert report["checkpoint_step"] == best.step == 4
    assert report["protocol"] == "dev_train"
    assert sorted(os.path.basename(p) for p in report["data_files"]) == [
        "dev.cgli.jsonl", "test.cgli.jsonl"]
    assert all(len(digest) == 64 for digest in report["data_files"].values())
    scores = report["metrics"]
    assert scores["num_pairs"] == 8
    assert 1 >= scores["accuracy"] >= scores["consistency"] >= scores["verifiability"] >= 0
    assert set(scores["precondition_f1_per_attribute"]) == set(schema.ATTRIBUTES)
    assert len(scores["failure_modes"]) == 8 and "loss/total" in scores
    assert report["baselines"]["random baseline (10 seeds)"]["num_pairs"] == 8

    lines = (evaluated / "test.predictions.jsonl").read_text().splitlines()
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

    markdown = (evaluated / "test.md").read_text()
    assert "| Model | Accuracy (%) | Consistency (%) | Verifiability (%) |" in markdown
    assert "| random baseline (10 seeds) |" in markdown and "| random bert |" in markdown
    for plot in ("test.failure_modes.png", "test.attributes.png"):
        data = (evaluated / plot).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_evaluate_mode_agrees_with_the_training_report(evaluated, workdir):
    """Training's final test report goes through the same path: same metrics, same records."""
    trained = json.loads((workdir / "reports" / "test.json").read_text())
    scored = json.loads((evaluated / "test.json").read_text())
    assert scored["metrics"].keys() == trained["metrics"].keys()
    for key, value in trained["metrics"].items():
        expected = pytest.approx(value) if isinstance(value, float) else value
        assert scored["metrics"][key] == expected, key
    assert ((workdir / "reports" / "test.predictions.jsonl").read_text()
            == (evaluated / "test.predictions.jsonl").read_text())


def test_other_checkpoint_and_split(workdir):
    result = evaluate.evaluate_checkpoint(tiny_config(), str(workdir), "2", "dev_holdout")
    assert result["step"] == 2 and result["checkpoint"] == "latest"
    report = json.loads((workdir / "eval" / "dev_holdout.json").read_text())
    assert report["checkpoint_step"] == 2
    assert report["metrics"]["num_pairs"] == len(
        protocol.load_protocol_splits(tiny_config().data).selection)
    with pytest.raises(evaluate.EvaluationError, match="dev_holdout, test, train"):
        evaluate.evaluate_checkpoint(tiny_config(), str(workdir), split="dev")


def test_missing_checkpoint_is_a_clear_error(tmp_path_factory, tmp_path):
    result = run_main(f"--workdir={tmp_path / 'untrained'}", "--mode=evaluate",
                      cache=cache_dir(tmp_path_factory))
    assert result.returncode == 1
    assert "error: no checkpoint 'best_verifiability'" in result.stderr
    assert "train first" in result.stderr and "Traceback" not in result.stderr


def test_mismatched_config_and_corrupt_checkpoint_are_clear_errors(workdir, tmp_path):
    other = tiny_config()
    other.model.tiered.detector_layers = 2
    with pytest.raises(checkpoints.CheckpointError, match="detector_layers: saved 1, now 2"):
        evaluate.evaluate_checkpoint(other, str(workdir))
    broken = tmp_path / "broken"
    shutil.copytree(workdir / "checkpoints", broken / "checkpoints")
    shutil.copytree(workdir / "tokenizer", broken / "tokenizer")
    step_dir = next((broken / "checkpoints" / "best_verifiability").glob("[0-9]*"))
    (step_dir / "params" / "manifest.ocdbt").unlink()
    with pytest.raises(checkpoints.CheckpointError, match="could not restore"):
        evaluate.evaluate_checkpoint(tiny_config(), str(broken))
    assert not (broken / "eval").exists()


def test_random_baseline_report(tmp_path):
    result = evaluate.random_baseline_report(tiny_config(), str(tmp_path), "test")
    names = sorted(p.name for p in (tmp_path / "eval").iterdir())
    assert names == [f"random_baseline.test.{end}" for end in (
        "attributes.png", "failure_modes.png", "json", "md")]
    report = json.loads((tmp_path / "eval" / "random_baseline.test.json").read_text())
    assert report["model"] == "random baseline (10 seeds)" and report["seeds"] == 10
    pairs = protocol.load_protocol_splits(tiny_config().data).test
    expected = random_baseline.random_baseline(pairs, seeds=10)
    for key in random_baseline.SCALAR_METRICS:
        assert report["metrics"][key] == pytest.approx(expected[key])
    modes = result["metrics"]["failure_modes"]
    assert sum(m["count"] for m in modes) == pytest.approx(len(pairs))
    assert sum(m["fraction"] for m in modes) == pytest.approx(1.0)
    assert "| random baseline (10 seeds) |" in (
        tmp_path / "eval" / "random_baseline.test.md").read_text()


def test_mean_of_metric_trees():
    trees = [{"a": 1.0, "n": 8, "flag": True, "rows": [{"c": 2}], "f": float("nan")},
             {"a": 3.0, "n": 8, "flag": True, "rows": [{"c": 5}], "f": 0.5}]
    assert evaluate._mean(trees) == {"a": 2.0, "n": 8, "flag": True, "rows": [{"c": 3.5}],
                                     "f": 0.5}


def test_eval_batch_size_is_rounded_up_to_the_devices():
    config = tiny_config()
    four_devices = types.SimpleNamespace(shape={"data": 2, "fsdp": 2})
    assert evaluate.eval_config(config, four_devices).train.eval_batch_size == 4
    assert config.train.eval_batch_size == 2
