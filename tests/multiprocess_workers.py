"""Bodies of the multi-process training checks (run in child processes by multiprocess_harness).

``training_worker`` runs the real training entry point (``train.train_and_evaluate``) of the tiny
tiered model; started in 2 processes × 2 devices or in 1 process × 4 devices, it does the same
global computation. ``restore_worker`` restores a checkpoint in a fresh process. Both write the
parameters as each process holds them (its addressable shards, with their positions in the
global arrays) to an ``.npz`` file, so the test can rebuild the global arrays without trusting
any collective, and check that replicas held by different processes are equal.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

# The global batch is split over 4 devices (2 processes × 2, or 1 × 4).
BATCH_SIZE = 4
EVAL_BATCH_SIZE = 8


def training_config(data_dir: str):
    """configs/tiny.py cut to one short epoch, on a fully sharded (FSDP) 4-device mesh.

    data=1, fsdp=4: large parameters are split over all 4 devices, so with 2 processes each
    process holds half of them; the batch is split over all 4 devices too.
    """
    from configs import tiny

    config = tiny.get_config()
    config.data.data_dir = data_dir
    # Every one of 10 dev pairs trains (no held-out slice: one eval program to compile, test's):
    # 3 steps of 4; in the last one process 1's share is padding only.
    config.data.protocol = "dev_all"
    config.data.max_pairs = 10
    config.train.num_epochs = 1
    config.train.batch_size = BATCH_SIZE
    config.train.eval_batch_size = EVAL_BATCH_SIZE
    config.train.log_every_steps = 1  # metrics.jsonl then holds every step's loss
    config.train.checkpoint_every_steps = 0  # one latest checkpoint, at the end of the epoch
    config.mesh.update(dict(data=1, fsdp=4))
    # Encoder dropout draws its mask per encoder row, and which row holds which sentence depends
    # on how the pairs are split over processes (each packs its own rows): off, so that 2
    # processes and 1 process compute the same thing. The tiered heads keep their dropout.
    config.model.random_encoder.update(dict(hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0))
    return config


def dump_shards(tree, path: str | os.PathLike) -> list[dict]:
    """Writes this process's shards of every array of ``tree`` to ``path`` (.npz).

    Returns one record per leaf: its key path, global shape, dtype, and for each shard the npz
    entry, the device id and the [start, stop) bounds of each dimension in the global array.
    """
    import jax

    arrays, leaves = {}, []
    for n, (key, leaf) in enumerate(jax.tree_util.tree_leaves_with_path(tree)):
        shards = []
        for j, shard in enumerate(leaf.addressable_shards):
            name = f"leaf{n}_shard{j}"
            arrays[name] = np.asarray(shard.data)
            bounds = [[s.start or 0, size if s.stop is None else s.stop]
                      for s, size in zip(shard.index, leaf.shape)]
            shards.append({"name": name, "device": shard.device.id, "index": bounds})
        leaves.append({"path": jax.tree_util.keystr(key), "shape": list(leaf.shape),
                       "dtype": str(leaf.dtype), "shards": shards})
    np.savez(path, **arrays)
    return leaves


def _record_train_steps(step_module) -> dict:
    """Makes every train step built from now on (by ``step_module.build_trainer``, the module
    ``trip_jax.training.step``) record its loss and its output state.

    Returns {"losses": [per-step loss arrays], "state": the last step's state}.
    """
    record = {"losses": [], "state": None}
    make_train_step = step_module.make_train_step

    def make_recording_step(*args, **kwargs):
        step = make_train_step(*args, **kwargs)

        def recording_step(state, batch):
            state, metrics = step(state, batch)
            record["losses"].append(metrics["loss/total"])
            record["state"] = state  # the next step donates it; only the last one is kept
            return state, metrics

        return recording_step

    step_module.make_train_step = make_recording_step
    return record


def _quiet_orbax() -> None:
    """Drops orbax's INFO lines (dozens per checkpoint) from this process's log, so that the
    log tail the harness reports on a failure shows the run's own lines."""
    logging.getLogger("absl").addFilter(
        lambda record: record.levelno >= logging.WARNING or "/orbax/" not in record.pathname)


def training_worker(data_dir: str, workdir: str, out_dir: str) -> dict:
    """Trains the tiny tiered model with ``train_and_evaluate`` in ``workdir``, then restores
    its latest checkpoint on the same mesh; dumps the final and the restored parameters."""
    import jax

    from trip_jax import train
    from trip_jax.evaluation import evaluate
    from trip_jax.training import checkpoints
    from trip_jax.training import step as training_step

    _quiet_orbax()
    record = _record_train_steps(training_step)
    test_metrics = train.train_and_evaluate(training_config(data_dir), workdir)
    # Each process reads its own copy of the replicated per-step losses.
    losses = [float(np.asarray(loss)) for loss in record["losses"]]
    restored = checkpoints.restore_for_eval(workdir, checkpoints.LATEST)
    index = jax.process_index()
    out = Path(out_dir)
    return {
        "process_index": index,
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_ids": sorted(d.id for d in jax.local_devices()),
        "losses": losses,
        "final_step": int(np.asarray(record["state"].step)),
        "test_metrics": {k: float(v) for k, v in evaluate.scalar_metrics(test_metrics).items()},
        "final_params": {"file": str(out / f"final_{index}.npz"), "leaves": dump_shards(
            record["state"].params, out / f"final_{index}.npz")},
        "restored_step": restored.step,
        "restored_params": {"file": str(out / f"restored_{index}.npz"), "leaves": dump_shards(
            restored.params, out / f"restored_{index}.npz")},
    }


def restore_worker(workdir: str, out_dir: str) -> dict:
    """Restores the latest checkpoint of ``workdir`` for evaluation on this process's devices
    (``checkpoints.restore_for_eval``'s default mesh) and dumps its parameters."""
    import jax

    from trip_jax.training import checkpoints

    _quiet_orbax()
    restored = checkpoints.restore_for_eval(workdir, checkpoints.LATEST)
    path = Path(out_dir) / "restored_fresh.npz"
    return {
        "device_count": jax.device_count(),
        "param_devices": sorted({d.id for x in jax.tree.leaves(restored.params)
                                 for d in x.sharding.device_set}),
        "step": restored.step,
        "params": {"file": str(path), "leaves": dump_shards(restored.params, path)},
    }
