"""The whole training loop on configs/tiny.py: train, checkpoint, resume, evaluate, NaN stop.

Runs on the shared TRIP data (conftest's ``data_dir``). The runs share a persistent compilation
cache, so only the first one pays for compiling the step functions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from flax import traverse_util

from configs import tiny
from trip_jax import train
from trip_jax.config.typed import as_dict, typed
from trip_jax.data import input_pipeline
from trip_jax.evaluation import ensemble, evaluate
from trip_jax.models import builders, param_names
from trip_jax.runtime import sharding
from trip_jax.training import checkpoint_reads, checkpoints, optimizers, reuse
from trip_jax.training import step as training_step
from trip_jax.training.state import create_train_state, init_params_from

KILL_AFTER_STEP = 2  # mid-epoch: the tiny config has 4 steps per epoch
pytestmark = pytest.mark.usefixtures("compilation_cache")


def params_of(workdir, which="latest"):
    """Host copy of a checkpoint's parameters."""
    return jax.device_get(checkpoints.restore_for_eval(str(workdir), which).params)


def assert_trees_equal(a, b):
    """Exact equality of two parameter trees (same structure, same bits)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


class Killed(Exception):
    """Stands in for the process being killed right after a checkpoint."""


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_config):
    """An uninterrupted tiny run: (workdir, test metrics)."""
    workdir = tmp_path_factory.mktemp("full")
    return workdir, train.train_and_evaluate(tiny_config(), str(workdir))


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, tiny_config):
    """The same run killed after the checkpoint of step 2, then started again."""
    workdir = tmp_path_factory.mktemp("resumed")
    save_latest = checkpoints.RunCheckpoints.save_latest

    def save_then_die(self, step, *args, **kwargs):
        save_latest(self, step, *args, **kwargs)
        if step == KILL_AFTER_STEP:
            raise Killed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoints.RunCheckpoints, "save_latest", save_then_die)
        with pytest.raises(Killed):
            train.train_and_evaluate(tiny_config(), str(workdir))
    # A record the killed run wrote after its last checkpoint: the resumed run logs it again.
    with (workdir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": KILL_AFTER_STEP + 1, "split": "train", "stale": True}) + "\n")
    steps_before_resume = sorted(
        int(p.name) for p in (workdir / "checkpoints" / "latest").iterdir() if p.name.isdigit())
    result = train.train_and_evaluate(tiny_config(), str(workdir))
    return workdir, result, steps_before_resume


def read_log(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_whole_loop_logs_checkpoints_and_reports(full_run):
    workdir, result = full_run
    log = read_log(workdir)
    splits = {r["split"] for r in log}
    assert splits == {"train", "dev_holdout", "test", "wall_time"}
    wall = [r for r in log if r["split"] == "wall_time"]
    assert len(wall) == 1 and wall[0]["seconds"] > 0
    assert log[-1]["split"] == "wall_time"  # written last, after the test reports
    train_steps = [r["step"] for r in log if r["split"] == "train"]
    assert train_steps == [2, 4, 6, 8]
    assert all(np.isfinite(r["loss/total"]) for r in log if r["split"] == "train")
    assert all(r["param_norm"] > 0 and r["grad_norm"] > 0 for r in log if r["split"] == "train")
    # Selection after each of the 2 epochs (reference rule: the score is the verifiability);
    # test for both best checkpoints.
    held_out = [r for r in log if r["split"] == "dev_holdout"]
    assert [r["step"] for r in held_out] == [4, 8]
    assert all(r["selection_score"] == r["verifiability"] for r in held_out)
    assert sorted(r["checkpoint"] for r in log if r["split"] == "test") == [
        "best_accuracy", "selected"]
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert 1 >= result["accuracy"] >= result["consistency"] >= result["verifiability"] >= 0
    report = json.loads((workdir / "reports" / "test.json").read_text())
    assert report["protocol"] == "dev_train"
    assert report["checkpoint"] == "selected"
    assert report["metrics"]["num_pairs"] == 8
    assert (workdir / "reports" / "best_accuracy" / "test.md").exists()
    predictions = (workdir / "reports" / "test.predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 8 and "pair_id" in json.loads(predictions[0])
    latest = sorted(int(p.name) for p in (workdir / "checkpoints" / "latest").iterdir()
                    if p.name.isdigit())
    assert latest == [6, 8]  # keep_checkpoints=2


def test_resume_reaches_the_parameters_of_an_uninterrupted_run(full_run, resumed_run):
    full_dir, full_result = full_run
    resumed_dir, resumed_result, steps_before_resume = resumed_run
    assert steps_before_resume == [KILL_AFTER_STEP]
    assert_trees_equal(params_of(full_dir), params_of(resumed_dir))
    assert resumed_result["accuracy"] == full_result["accuracy"]
    resumed_train = [r for r in read_log(resumed_dir) if r["split"] == "train"]
    full_train = {r["step"]: r for r in read_log(full_dir) if r["split"] == "train"}
    for record in resumed_train:
        assert record["loss/total"] == full_train[record["step"]]["loss/total"]
    # One record per event, as in the uninterrupted run: nothing stale, nothing twice.
    keys = lambda log: [(r["step"], r["split"]) for r in log if r["split"] != "test"]
    assert keys(read_log(resumed_dir)) == keys(read_log(full_dir))
    assert not any("stale" in r for r in read_log(resumed_dir))


def test_restore_for_eval_needs_only_the_workdir(full_run):
    workdir, _ = full_run
    restored = checkpoints.restore_for_eval(str(workdir))
    assert restored.kind == "selected"
    assert restored.meta["protocol"] == "dev_train"
    assert set(restored.meta["metrics"]) >= {"accuracy", "consistency", "verifiability"}
    ids = restored.tokenizer("the apple", "Mary ate the apple.")["input_ids"]
    batch = builders.example_batch(7, seq_len=len(ids))
    batch["input_ids"][:] = ids
    out = restored.model.apply({"params": restored.params}, batch)
    assert out["conflict_prob"].shape == (1, 2, 1, 7)
    by_step = checkpoints.restore_for_eval(str(workdir), restored.step)
    assert_trees_equal(jax.device_get(by_step.params), jax.device_get(restored.params))


def test_checkpoint_errors_are_clear(tiny_config, full_run, tmp_path):
    workdir, _ = full_run
    with pytest.raises(checkpoints.CheckpointError, match="no checkpoint"):
        checkpoints.restore_for_eval(str(tmp_path / "empty"))
    other = tiny_config()
    other.model.tiered.detector_layers = 2
    with pytest.raises(checkpoints.CheckpointError, match="detector_layers"):
        checkpoints.restore_for_eval(str(workdir), config=typed(other))
    # A model option added after a checkpoint was written (a config saved before versions):
    # absent there, so at its default.
    saved = as_dict(typed(tiny_config()))
    del saved["config_version"], saved["model"]["tiered"]["detector_norm_first"]
    checkpoint_reads.check_compatible(saved, typed(tiny_config()), "older run")
    other = tiny_config()
    other.model.tiered.detector_norm_first = True
    with pytest.raises(checkpoints.CheckpointError, match="detector_norm_first"):
        checkpoint_reads.check_compatible(saved, typed(other), "older run")
    broken = tmp_path / "broken"
    shutil.copytree(workdir, broken)
    step_dir = next((broken / "checkpoints" / "selected").glob("[0-9]*"))
    (step_dir / "params" / "manifest.ocdbt").unlink()
    with pytest.raises(checkpoints.CheckpointError, match="could not restore"):
        checkpoints.restore_for_eval(str(broken))


def trainer_of(config):
    """The trainer (optimizer, abstract state, shardings) a run of ``config`` builds."""
    config = typed(config)
    data = input_pipeline.prepare_data(config)
    hf_config, _ = builders.build_encoder_config(config.model, data.tokenizer)
    model = builders.build_model(config, hf_config)
    return training_step.build_trainer(config, model, sharding.create_mesh(config.mesh), 10)


def latest_state(workdir, trainer, **kwargs):
    """(params, opt_state, meta) of the latest checkpoint of ``workdir``, on the host."""
    abstract, shardings = trainer.abstract_state, trainer.state_shardings
    ckpts = checkpoints.RunCheckpoints(str(workdir), keep=2, async_save=False)
    try:
        params, opt_state, meta = ckpts.restore_latest(
            abstract.params, abstract.opt_state, shardings.params, shardings.opt_state,
            trainer.config, **kwargs)
    finally:
        ckpts.close()
    return jax.device_get(params), jax.device_get(opt_state), meta


def per_layer_copy(workdir, target):
    """A copy of ``workdir`` whose selected and latest checkpoints hold the parameters one entry
    per layer, as saved before the layers were stacked (the latest keeps its optimizer state)."""
    shutil.copytree(workdir, target)
    for kind in (checkpoints.SELECTED, checkpoints.LATEST):
        restored = checkpoints.restore_for_eval(str(workdir), kind)
        flat = traverse_util.flatten_dict(jax.device_get(restored.params))
        trees = {"params": traverse_util.unflatten_dict(param_names.unstack_layers(flat))}
        items = ["params", "meta"]
        if kind == checkpoints.LATEST:
            items.insert(1, "opt_state")
        step_dir = target / "checkpoints" / kind / str(restored.step)
        old = ocp.CheckpointManager(target / "checkpoints" / kind, item_names=items)
        if kind == checkpoints.LATEST:
            trees["opt_state"] = old.restore(restored.step, args=ocp.args.Composite(
                opt_state=ocp.args.StandardRestore())).opt_state
        meta = {k: v for k, v in restored.meta.items() if k != checkpoint_reads.CHECKSUMS}
        shutil.rmtree(step_dir)
        old.reload()
        old.save(restored.step, args=ocp.args.Composite(
            **{name: ocp.args.StandardSave(tree) for name, tree in trees.items()},
            meta=ocp.args.JsonSave(checkpoint_reads.with_checksums(meta, **trees))), force=True)
        old.wait_until_finished()
        old.close()
    return target


def test_a_checkpoint_saved_per_layer_is_refused_in_one_line(tiny_config, full_run, tmp_path):
    """Per-layer checkpoints (before the layers were stacked) are no longer read: evaluation
    and a resumed run stop in one line saying to retrain or to use an older trip_jax."""
    workdir, _ = full_run
    old = per_layer_copy(workdir, tmp_path / "per_layer")
    step_dir = next((old / "checkpoints" / "selected").glob("[0-9]*"))
    saved = ocp.StandardCheckpointHandler().metadata(epath.Path(step_dir) / "params").tree
    assert param_names.per_layer_paths(traverse_util.flatten_dict(saved))
    for refused in (lambda: checkpoints.restore_for_eval(str(old)),
                    lambda: latest_state(old, trainer_of(tiny_config()))):
        with pytest.raises(checkpoints.CheckpointError) as err:
            refused()
        message = str(err.value)
        assert "\n" not in message and "per-layer parameters" in message
        assert "train the run again" in message


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_config, full_run,
                                                                   tmp_path):
    workdir = tmp_path / "diverging"
    shutil.copytree(full_run[0], workdir)
    good = params_of(workdir)
    restore_latest = checkpoints.RunCheckpoints.restore_latest

    def restore_poisoned(self, *args, **kwargs):
        params, opt_state, meta = restore_latest(self, *args, **kwargs)
        poisoned = jax.tree.map(lambda x: x * np.float32("nan"), params)
        return poisoned, opt_state, meta

    config = tiny_config()
    config.train.num_epochs = 3  # continue after the finished run's step 8
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoints.RunCheckpoints, "restore_latest", restore_poisoned)
        with pytest.raises(train.TrainingDiverged, match=r"step 9\b.*step 8 .*intact"):
            train.train_and_evaluate(config, str(workdir))
    latest = sorted(int(p.name) for p in (workdir / "checkpoints" / "latest").iterdir()
                    if p.name.isdigit())
    assert latest == [6, 8]
    assert_trees_equal(params_of(workdir), good)


def test_misspelt_config_override_is_an_error(tmp_path, repo, main_install):
    command = [sys.executable, "-m", "trip_jax.main", "--config=configs/tiny.py",
               f"--workdir={tmp_path}", "--config.train.learnin_rate=0.1"]
    result = subprocess.run(command, cwd=repo, env=main_install(dict(os.environ)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "learnin_rate" in result.stderr and "learning_rate" in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_loss_preset_argument_and_overrides():
    config = tiny.get_config("losses=omit_states")
    assert (config.loss.pre_weight, config.loss.eff_weight, config.loss.conflict_weight,
            config.loss.story_weight) == (0.0, 0.0, 0.5, 0.5)
    with pytest.raises(ValueError, match="unknown losses 'no_such_preset'"):
        tiny.get_config("losses=no_such_preset")


def test_dense_layout_scores_a_checkpoint_like_packed_tokens(tiny_config, full_run):
    workdir, _ = full_run
    config = tiny_config()
    one = ensemble.evaluate_members(config, str(workdir), "latest", "test")["metrics"]
    config.data.layout = "dense"
    two = ensemble.evaluate_members(config, str(workdir), "latest", "test")["metrics"]
    for key in ("accuracy", "consistency", "verifiability"):
        assert one[key] == two[key], key
    np.testing.assert_allclose(two["loss/total"], one["loss/total"], rtol=1e-5)


def test_speed_options_train(tiny_config, tmp_path, monkeypatch):
    config = tiny_config()
    config.train.num_epochs = 1
    config.data.layout, config.data.seq_len = "dense", 32
    config.train.prng_impl = "rbg"
    # No selection split, and every batch padded to 16 entities: one train step and one eval
    # step to compile, not three and two (issue 54: the test's time).
    config.data.protocol = "dev_all"
    config.data.buckets.entity_min = 16
    data = input_pipeline.prepare_data(config)
    batch = next(input_pipeline.batch_stream(data.train, data.layout, 2, shuffle=True,
                                             seed=config.train.seed, epoch=0))
    assert batch["input_ids"].shape[1] == 32
    # The run draws with the config's PRNG, whatever the process's; the process's comes back.
    seen, run = [], train._train_and_evaluate
    monkeypatch.setattr(train, "_train_and_evaluate", lambda *args: seen.append(
        jax.config.jax_default_prng_impl) or run(*args))
    assert jax.config.jax_default_prng_impl == "threefry2x32"
    result = train.train_and_evaluate(config, str(tmp_path))
    assert seen == ["rbg"] and jax.config.jax_default_prng_impl == "threefry2x32"
    log = read_log(tmp_path)
    assert [r["step"] for r in log if r["split"] == "train"] == [2, 4]
    assert all(np.isfinite(r["loss/total"]) for r in log if r["split"] == "train")
    assert all(r["param_norm"] > 0 and r["grad_norm"] > 0 for r in log if r["split"] == "train")
    assert 1 >= result["accuracy"] >= result["consistency"] >= result["verifiability"] >= 0


def test_the_train_step_computes_one_norm_the_clips(tiny_config, monkeypatch):
    config = tiny_config()
    assert config.train.grad_clip_norm > 0
    computed = []
    norm = optimizers.global_norm
    monkeypatch.setattr(optimizers, "global_norm",
                        lambda tree: computed.append(jax.tree.structure(tree)) or norm(tree))
    trainer = trainer_of(config)
    data = input_pipeline.prepare_data(config)
    local = next(iter(input_pipeline.batch_stream(
        data.train, data.layout, config.train.batch_size, shuffle=False, seed=0, epoch=0,
        shards=sharding.local_batch_shards(trainer.mesh))))
    state = trainer.abstract_state
    # A step of its own: the trainer's may have been traced already in this process
    # (``build_trainer`` builds each equal trainer once), without the counting norm.
    train_step = training_step.make_train_step(
        trainer.model, trainer.tx, trainer.schedule, trainer.config.loss, trainer.mesh,
        trainer.state_shardings, trainer.config.train.seed)
    train_step.trace(state, input_pipeline.global_batch(local, trainer.mesh))
    # One norm: the gradients' (the clip reuses it); the parameters' is not in the step.
    assert computed == [jax.tree.structure(state.params)]


def test_equal_trainers_and_eval_steps_are_built_once(tiny_config, full_run):
    config = tiny_config()
    trainer = trainer_of(config)
    assert trainer_of(config).train_step is trainer.train_step  # equal config, model and mesh
    fold = tiny_config()
    fold.data.holdout_seed += 1  # another held-out slice, as another fold: the same steps
    assert trainer_of(fold).train_step is trainer.train_step
    assert trainer_of(fold).config.data.holdout_seed == fold.data.holdout_seed
    other = tiny_config()
    other.train.seed += 1
    assert trainer_of(other).train_step is not trainer.train_step
    assert trainer_of(other).eval_step is trainer.eval_step  # the seed is not in the eval step
    # A restored checkpoint of an equal model evaluates with the same step.
    restored = checkpoints.restore_for_eval(str(full_run[0]))
    assert evaluate.checkpoint_eval_step(restored) is trainer.eval_step
    # Only the most recent builds are kept.
    for seed in range(100, 100 + reuse.KEEP_BUILT):
        other.train.seed = seed
        trainer_of(other)
    assert trainer_of(config).train_step is not trainer.train_step


def test_head_learning_rate_moves_heads_and_encoder_at_their_own_rates(tiny_config):
    config = tiny_config()
    config.train.learning_rate, config.train.head_learning_rate = 1e-3, 1e-2
    config.train.grad_clip_norm = 0.0
    tx, _ = optimizers.make_optimizer(config.train, total_steps=10)
    params = {"encoder": {"w": np.ones(3, np.float32)}, "detector": {"w": np.ones(3, np.float32)}}
    grads = jax.tree.map(np.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    # Adam's first step moves every parameter by its learning rate (constant schedule).
    np.testing.assert_allclose(updates["encoder"]["w"], -1e-3, rtol=1e-4)
    np.testing.assert_allclose(updates["detector"]["w"], -1e-2, rtol=1e-4)
    config.train.head_learning_rate = 0.0  # the reference: one rate for everything
    tx, _ = optimizers.make_optimizer(config.train, total_steps=10)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["detector"]["w"], -1e-3, rtol=1e-4)


def test_frozen_encoder_gets_no_update(tiny_config):
    config = tiny_config()
    config.train.freeze_encoder = True
    tx, _ = optimizers.make_optimizer(config.train, total_steps=10)
    params = {"encoder": {"w": np.ones(3, np.float32)}, "detector": {"w": np.ones(3, np.float32)}}
    grads = jax.tree.map(np.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert not np.asarray(updates["encoder"]["w"]).any()
    np.testing.assert_allclose(updates["detector"]["w"], -config.train.learning_rate, rtol=1e-4)


def fresh_params(config):
    """A new run's initial parameters for ``config`` (as ``train_and_evaluate`` builds them)."""
    config = typed(config)
    data = input_pipeline.prepare_data(config)
    hf_config, encoder_params = builders.build_encoder_config(config.model, data.tokenizer)
    model = builders.build_model(config, hf_config)
    tx, _ = optimizers.make_optimizer(config.train, total_steps=10)
    state, _ = create_train_state(config, model, tx, sharding.create_mesh(config.mesh),
                                  encoder_params)
    return jax.device_get(state.params), state.params


def test_init_from_takes_an_earlier_runs_parameters_except_skipped(tiny_config, full_run):
    source_dir, _ = full_run
    source = params_of(source_dir, "best_accuracy")
    config = tiny_config()
    assert config.model.tiered.detector_layers == 1
    config.model.tiered.detector_layers = 2   # a detector layer the source run lacks
    config.train.init_from = str(source_dir)
    config.train.init_from_checkpoint = "best_accuracy"
    config.train.init_skip = r"\['conflict_out'\]"
    fresh, placed = fresh_params(config)
    params = jax.device_get(init_params_from(config, placed))
    for group in ("encoder", "state_heads", "states_proj", "embedding_proj"):
        assert_trees_equal(params[group], source[group])
    # Layers stacked: layer 0 from the source, layer 1 (the source has none) fresh.
    layer = lambda tree, i: jax.tree.map(lambda x: x[i], tree["detector"]["layers"])
    assert_trees_equal(layer(params, 0), layer(source, 0))
    assert_trees_equal(params["detector"]["conflict_out"],
                       fresh["detector"]["conflict_out"])  # skipped
    assert_trees_equal(layer(params, 1), layer(fresh, 1))  # not in source
    assert not np.allclose(fresh["state_heads"]["heads"]["dense"]["kernel"],
                           source["state_heads"]["heads"]["dense"]["kernel"])
    config.model.tiered.detector_ff = 48  # another detector shape, no longer skipped
    config.train.init_skip = ""
    with pytest.raises(ValueError, match="detector.*shape"):
        init_params_from(config, fresh_params(config)[1])
    config.model.tokenizer = "word_level:roberta"  # tiny's is word_level:bert
    with pytest.raises(ValueError, match="model.tokenizer"):
        init_params_from(config, placed)


def test_run_from_an_earlier_run_with_a_frozen_encoder(tiny_config, full_run, tmp_path):
    source_dir, _ = full_run
    config = tiny_config()
    config.train.num_epochs = 1
    config.train.init_from = str(source_dir)
    config.train.freeze_encoder = True
    result = train.train_and_evaluate(config, str(tmp_path))
    source, trained = params_of(source_dir, "latest"), params_of(tmp_path, "latest")
    assert_trees_equal(trained["encoder"], source["encoder"])  # loaded, then left unchanged
    assert not np.allclose(trained["detector"]["conflict_out"]["kernel"],
                           source["detector"]["conflict_out"]["kernel"])  # trained on
    assert 1 >= result["accuracy"] >= result["consistency"] >= result["verifiability"] >= 0
