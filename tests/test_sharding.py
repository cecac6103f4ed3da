"""Mesh and partition rules; one device vs 8 host devices (data-parallel and FSDP) give the same
training; checkpoints restore onto another device count.

The multi-device check runs in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set before JAX starts);
``equivalence_worker`` is its body.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

from trip_jax.config.typed import as_dict, typed
from trip_jax.runtime import sharding

STEPS = 3
LAYOUTS = {"one_device": (1, 1), "data_parallel": (8, 1), "fsdp": (2, 4)}


def test_param_spec_shards_large_matrices_on_their_largest_divisible_dimension():
    assert sharding.param_spec((1024, 4096), 8, 2 ** 18) == P(None, "fsdp")
    assert sharding.param_spec((40, 1024, 1024), 8, 2 ** 18) == P(None, "fsdp", None)
    assert sharding.param_spec((50265, 1024), 8, 2 ** 18) == P(None, "fsdp")  # 50265 % 8 != 0
    assert sharding.param_spec((1024,), 8, 2 ** 18) == P()  # small: replicated
    assert sharding.param_spec((1023, 1025), 8, 1) == P()  # nothing divides
    assert sharding.param_spec((1024, 4096), 1, 1) == P()  # no fsdp axis


def test_mesh_sizes_are_checked():
    import jax

    mesh = sharding.create_mesh(ConfigDict(dict(data=-1, fsdp=1)))
    assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1}
    with pytest.raises(ValueError, match="does not match"):
        sharding.create_mesh(ConfigDict(dict(data=jax.device_count() + 1, fsdp=1)))
    with pytest.raises(ValueError, match="at most one"):
        sharding.create_mesh(ConfigDict(dict(data=-1, fsdp=-1)))


def on_eight_devices(code: str, repo, test_xla_flags, main_install
                     ) -> subprocess.CompletedProcess:
    """Runs ``python -c code`` (importing this module's workers) on 8 host CPU devices with the
    tests' compile flags; asserts it succeeded."""
    env = main_install({
        **os.environ, "XLA_FLAGS": f"{test_xla_flags} --xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([
            str(repo), str(repo / "tests"), os.environ.get("PYTHONPATH", "")])})
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def equivalence_worker(data_dir: str, checkpoint_dir: str) -> dict:
    """Trains STEPS steps of the tiny config on each layout of LAYOUTS from the same
    initialisation; saves the FSDP parameters and restores them on one device."""
    import dataclasses
    import itertools

    import jax

    from configs import tiny
    from trip_jax.data import input_pipeline
    from trip_jax.models import builders
    from trip_jax.training import checkpoint_reads, checkpoints, losses, optimizers
    from trip_jax.training import state as train_state, step as train_step
    from trip_jax.data import layouts

    config = tiny.get_config()
    config.data.data_dir = data_dir
    config.data.max_pairs = 16
    config.train.batch_size = 8
    # Smaller programs compile faster; the encoder keeps its dropout (sharded random bits).
    config.model.random_encoder.num_hidden_layers = 1
    config.model.tiered.update(dict(head_dropout=0.0, projection_dropout=0.0,
                                    detector_input_dropout=0.0, detector_dropout=0.0,
                                    conflict_dropout=0.0))
    built = typed(config)  # the config of the run, as an entry point builds it
    data = input_pipeline.prepare_data(built)
    hf_config, _ = builders.build_encoder_config(built.model, data.tokenizer)
    model = builders.build_model(built, hf_config)
    tx, schedule = optimizers.make_optimizer(config.train, STEPS)
    loss_config = losses.LossConfig.from_mapping(config.loss)
    # Built in 8 pieces (the most devices a mesh below has), so no mesh pads them.
    batches = itertools.chain.from_iterable(
        input_pipeline.batch_stream(data.train, data.layout, 8, shuffle=True,
                                    seed=config.train.seed, epoch=e, shards=8)
        for e in range(STEPS))
    local_batches = list(itertools.islice(batches, STEPS))

    runs, specs, meshes = {}, {}, {}
    initial = None
    for name, (d, f) in LAYOUTS.items():
        mesh = sharding.create_mesh(ConfigDict(dict(data=d, fsdp=f)), jax.devices()[:d * f])
        if initial is None:  # one initialisation (and one init compilation) for every layout
            state, shardings = train_state.create_train_state(config, model, tx, mesh)
            initial = jax.device_get(state)
        else:
            shardings = sharding.tree_shardings(mesh, initial, config.mesh.fsdp_min_size)
            state = jax.device_put(initial, shardings)
        step = train_step.make_train_step(model, tx, schedule, loss_config, mesh, shardings,
                                          config.train.seed)
        losses_ = []
        for local in local_batches:
            state, metrics = step(state, input_pipeline.global_batch(local, mesh))
            losses_.append(float(metrics["loss/total"]))
        runs[name] = (losses_, jax.device_get(state.params))
        specs[name] = sorted({str(s.spec) for s in jax.tree.leaves(shardings.params)})
        meshes[name] = (mesh, state)

    # The dense layout split over 8 devices predicts like packed_tokens (the same E).
    config.data.layout = "dense"
    dense_layout = dataclasses.replace(layouts.from_config(config.data),
                                       num_entities=data.layout.num_entities)
    dense_local = next(iter(input_pipeline.batch_stream(data.train, dense_layout, 8,
                                                        shuffle=True, seed=config.train.seed,
                                                        epoch=0, shards=8)))
    assert "segment_ids" not in dense_local
    mesh, state = meshes["data_parallel"]
    eval_step = train_step.make_eval_step(model, loss_config, mesh,
                                     jax.tree.map(lambda x: x.sharding, state.params))
    one = eval_step(state.params, input_pipeline.global_batch(local_batches[0], mesh))
    two = eval_step(state.params, input_pipeline.global_batch(dense_local, mesh))
    dense_diff = max(float(np.max(np.abs(np.asarray(one[k], np.float64) -
                                               np.asarray(two[k], np.float64))))
                           for k in ("conflict_prob", "story_logits", "pre_pred", "eff_pred"))

    # Save the FSDP parameters (sharded over 8 devices) as a best checkpoint and restore them
    # for evaluation on one device.
    fsdp_state = meshes["fsdp"][1]
    checkpoints.write_run_files(checkpoint_dir, built, hf_config, data.tokenizer)
    saver = checkpoints.RunCheckpoints(checkpoint_dir, keep=1, async_save=False)
    saver.save_if_best(STEPS, fsdp_state.params, {
        "step": STEPS, "metrics": {"accuracy": 0.5, "consistency": 0.0, "verifiability": 0.0},
        "config": as_dict(built), "encoder_config": hf_config.to_dict()})
    saver.close()
    restored = checkpoints.restore_for_eval(checkpoint_dir, mesh=meshes["one_device"][0])
    restored_devices = {len(x.sharding.device_set) for x in jax.tree.leaves(restored.params)}
    restore_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree.leaves(jax.device_get(restored.params)), jax.tree.leaves(runs["fsdp"][1])))
    # The parameters sharded over 8 devices and restored onto one: the same checksums.
    same_checksums = (checkpoint_reads.tree_checksums(fsdp_state.params)
                      == checkpoint_reads.tree_checksums(restored.params))

    base_losses, base_params = runs["one_device"]
    result = {"device_count": jax.device_count(), "specs": specs, "losses": {},
              "param_diff": {}, "restored_devices": sorted(restored_devices),
              "restore_diff": restore_diff, "dense_diff": dense_diff,
              "same_checksums": same_checksums}
    for name, (run_losses, run_params) in runs.items():
        result["losses"][name] = run_losses
        result["param_diff"][name] = max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(jax.tree.leaves(run_params), jax.tree.leaves(base_params)))
    assert base_losses  # every layout trained
    return result


def test_data_parallel_and_fsdp_train_like_one_device(tmp_path, repo, data_dir, test_xla_flags,
                                                      main_install):
    out = tmp_path / "result.json"
    code = ("import json, sys; from test_sharding import equivalence_worker; "
            f"json.dump(equivalence_worker({data_dir!r}, {str(tmp_path / 'ckpt')!r}), "
            f"open({str(out)!r}, 'w'))")
    # The check is about agreement between layouts, not speed: the tests' fast-compile flags.
    on_eight_devices(code, repo, test_xla_flags, main_install)
    result = json.loads(out.read_text())
    assert result["device_count"] == 8
    # FSDP really shards parameters; the other layouts replicate them.
    assert any("fsdp" in spec for spec in result["specs"]["fsdp"])
    assert result["specs"]["one_device"] == result["specs"]["data_parallel"] == [str(P())]
    base = result["losses"]["one_device"]
    assert len(base) == STEPS and all(np.isfinite(base))
    for name in ("data_parallel", "fsdp"):
        np.testing.assert_allclose(result["losses"][name], base, rtol=1e-5, atol=1e-6)
        assert result["param_diff"][name] < 1e-5, (name, result["param_diff"][name])
    # The FSDP checkpoint (8 devices) restores bit-for-bit onto a single device.
    assert result["restored_devices"] == [1]
    assert result["restore_diff"] == 0.0
    assert result["same_checksums"]
    assert result["dense_diff"] < 1e-5


def loop_collectives_worker() -> dict:
    """The tiny config's train step (2 encoder layers) lowered from abstract shapes for a 2 x 4
    (data, fsdp) mesh of 8 host devices and compiled: {loop body: its collectives' kinds}."""
    import re

    import jax

    from configs import tiny
    from trip_jax.compile import encoders, figures, shapes
    from trip_jax.models import builders
    from trip_jax.training import step as train_step

    config = tiny.get_config()
    config.mesh.update(dict(data=2, fsdp=4, fsdp_min_size=1))
    config.model.random_encoder.num_hidden_layers = 2
    built = typed(config)
    model = builders.build_model(built, encoders.encoder_config(built))
    trainer = train_step.build_trainer(built, model, sharding.create_mesh(built.mesh), 1)
    batch = shapes.batch_spec(built, 8, 8)
    text = trainer.train_step.lower(trainer.abstract_state, batch).compile().as_text()
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    inside, current = {}, None
    for line in text.splitlines():
        start = re.match(r"(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if start:
            current = start.group(1)
        found = re.search(rf" ({'|'.join(figures.COLLECTIVES)})(-start)?\(", line)
        if found and current in bodies:
            inside.setdefault(current, []).append(found.group(1))
    return {"device_count": jax.device_count(), "loops": len(bodies), "inside": inside}


def test_fsdp_gathers_parameters_not_activations_in_the_layers(repo, test_xla_flags,
                                                               main_install):
    # Without sharding.gathered XLA split the layers' matmuls over fsdp along the weights and
    # moved activations between devices in every layer (15 collectives a layer loop here;
    # docs/compile.md#fsdp); with it the layers' loops only reduce their gradients.
    code = ("import json; from test_sharding import loop_collectives_worker; "
            "print(json.dumps(loop_collectives_worker()))")
    proc = on_eight_devices(code, repo, test_xla_flags, main_install)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device_count"] == 8 and result["loops"] > 0
    assert all(kinds == ["all-reduce"] for kinds in result["inside"].values()), result
