"""Training: the loop, from a config and a workdir to the final test reports.

``train_and_evaluate(config, workdir)`` trains, evaluates on the selection pairs after every
epoch, keeps the latest and best checkpoints and scores the best ones on test; re-running it
resumes to the same parameters. Details: docs/reference.md#training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import logging
from etils import epath

from trip_jax.config.sections import Config
from trip_jax.config.typed import as_dict, typed
from trip_jax.data import input_pipeline
from trip_jax.evaluation import evaluate
from trip_jax.models import builders
from trip_jax.runtime import jax_setup, sharding, workdir_lock
from trip_jax.training import checkpoints, selection
from trip_jax.data.input_pipeline import RunData
from trip_jax.training.metric_log import MetricLog
from trip_jax.training.state import TrainState, init_params_from
from trip_jax.training.step import Trainer, build_trainer


class TrainingDiverged(FloatingPointError):
    """The loss, the gradient norm or the parameters' norm became NaN or infinite."""


# ------------------------------------------------------------------------------------------
# The loop.

class _PendingMetrics:
    """Step metrics still on device; fetched (and checked for divergence) in one go."""

    def __init__(self):
        self.items: list[tuple[int, dict]] = []

    def add(self, step: int, step_metrics: dict) -> None:
        self.items.append((step, step_metrics))

    def fetch(self, last_good: Callable[[], str]) -> dict[str, float] | None:
        """Returns the mean of every pending metric; raises TrainingDiverged at the first
        non-finite step."""
        if not self.items:
            return None
        host = jax.device_get([m for _, m in self.items])
        steps = [s for s, _ in self.items]
        self.items = []
        for step, values in zip(steps, host):
            if not values["finite"]:
                raise TrainingDiverged(
                    f"training diverged at step {step}: loss={float(values['loss/total'])}, "
                    f"grad_norm={float(values['grad_norm'])} (NaN or inf). Stopped before "
                    f"saving anything from it; {last_good()}")
        keys = [k for k in host[0] if k != "finite"]
        return {k: float(np.mean([h[k] for h in host])) for k in keys}


@dataclasses.dataclass
class RunSetup:
    """What one training run works with; fixed for the whole run."""

    config: Config
    workdir: epath.Path
    trainer: Trainer
    data: RunData
    hf_config: Any
    ckpts: checkpoints.RunCheckpoints
    log: MetricLog

    @property
    def steps_per_epoch(self) -> int:
        """Train steps (batches) per epoch."""
        return input_pipeline.num_batches(len(self.data.train), self.config.train.batch_size)

    @property
    def total_steps(self) -> int:
        """Train steps of the whole run."""
        return self.steps_per_epoch * self.config.train.num_epochs

    def meta(self, step: int, scores=None) -> dict:
        """A checkpoint's metadata (``trip_jax.training.checkpoints``)."""
        splits = self.data.splits
        return {"step": step, "epoch": step / self.steps_per_epoch, "protocol": splits.protocol,
                "selection_split": splits.selection_name, "metrics": dict(scores or {}),
                "config": as_dict(self.config),
                "encoder_config": self.hf_config.to_dict()}

    def last_good(self) -> str:
        """Where the last good checkpoint is (for the divergence message)."""
        latest = self.ckpts.latest_step()
        where = self.workdir / "checkpoints" / checkpoints.LATEST
        return ("no checkpoint had been saved yet" if latest is None else
                f"the last good checkpoint is step {latest} in {where}, intact")


def train_and_evaluate(config: Config | Any, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) in ``workdir``, then scores the best checkpoints on test; ``config``
    is the typed config, or a ConfigDict it is built from (``trip_jax.config.typed``).

    Returns the test metrics of the selected checkpoint. The run draws its keys with
    ``config.train.prng_impl`` (the process's setting comes back afterwards). It holds the
    workdir's lock (``trip_jax.runtime.workdir_lock``) from before it writes anything:
    WorkdirLocked, with the workdir untouched, when another run holds it. A workdir this call
    created and left empty (a run that stopped before it wrote anything) is removed.
    """
    started = time.time()
    config = typed(config)
    workdir = epath.Path(workdir)
    created, folder = [], workdir  # the folders mkdir makes, deepest first
    while not folder.exists() and folder.parent != folder:
        created.append(folder)
        folder = folder.parent
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir_lock.acquire_for_run(workdir)
    try:
        with jax_setup.prng_impl(config.train.prng_impl):
            return _train_and_evaluate(config, workdir, started)
    finally:
        if lock is not None:
            # Nothing but the lock in a workdir this call made: the run stopped before it began.
            empty = created and [p.name for p in workdir.iterdir()] == [workdir_lock.LOCK_FILE]
            if empty:
                (workdir / workdir_lock.LOCK_FILE).unlink()
            lock.release()
            for folder in created if empty else ():  # (a cross-validation's W of W/fold0 too)
                if folder.is_dir() and not list(folder.iterdir()):
                    folder.rmdir()


def _train_and_evaluate(config: Config, workdir: epath.Path, started: float) -> dict[str, Any]:
    """``train_and_evaluate`` once the workdir is locked."""
    mesh = sharding.create_mesh(config.mesh)
    sharding.check_batch_split(config.train.batch_size, mesh.shape)
    logging.info("mesh %s over %d devices (%d processes)", dict(mesh.shape), mesh.size,
                 jax.process_count())

    data = input_pipeline.prepare_data(config)
    splits = data.splits
    logging.info("protocol %s: %d train pairs, %d selection pairs (%s), %d test pairs",
                 splits.protocol, len(data.train), len(data.selection), splits.selection_name,
                 len(data.test))
    for name, encoded, size in (("train", data.train, config.train.batch_size),
                                (splits.selection_name, data.selection,
                                 config.train.eval_batch_size),
                                ("test", data.test, config.train.eval_batch_size)):
        if not encoded:  # dev_cv reads no test, dev_all has no selection split
            continue
        logging.info("layout of %s: %s", name,
                     input_pipeline.packing_summary(encoded, data.layout, size))
    hf_config, encoder_params = builders.build_encoder_config(config.model, data.tokenizer)
    model = builders.build_model(config, hf_config)
    checkpoints.write_run_files(str(workdir), config, hf_config, data.tokenizer)
    total_steps = (input_pipeline.num_batches(len(data.train), config.train.batch_size)
                   * config.train.num_epochs)
    trainer = build_trainer(config, model, mesh, total_steps)
    ckpts = checkpoints.RunCheckpoints(str(workdir), keep=config.train.keep_checkpoints,
                                       async_save=config.train.async_checkpoints)
    log = MetricLog(workdir)
    setup = RunSetup(config, workdir, trainer, data, hf_config, ckpts, log)
    try:
        try:
            state, history = _initial_state(setup, encoder_params)
            log.drop_after(int(jax.device_get(state.step)))
            TrainLoop(setup, state, history).run()
        finally:
            ckpts.close()
        results = _final_reports(setup)
        # This process's wall time, setup and compilation included (a resumed run logs one
        # record per process; run_summary adds them up).
        log.write(setup.total_steps, "wall_time", {"seconds": time.time() - started})
        return results
    finally:
        log.close()


def _initial_state(setup: RunSetup, encoder_params) -> tuple[TrainState, list[dict]]:
    """The latest checkpoint's train state and selection history when there is one, else a
    fresh state (with the parameters of ``train.init_from`` where given) and no history."""
    config, trainer = setup.config, setup.trainer
    if setup.ckpts.latest_step() is None:
        state = trainer.fresh_state(encoder_params)
        if config.train.init_from:
            state = state.replace(params=init_params_from(config, state.params))
        return state, []
    abstract, shardings = trainer.abstract_state, trainer.state_shardings
    params, opt_state, meta = setup.ckpts.restore_latest(
        abstract.params, abstract.opt_state, shardings.params, shardings.opt_state, config)
    logging.info("resuming from the checkpoint of step %d (epoch %.2f)", meta["step"],
                 meta["epoch"])
    step = jax.device_put(jnp.asarray(meta["step"], jnp.int32), shardings.step)
    return (TrainState(step=step, params=params, opt_state=opt_state),
            list(meta.get("selection_history", [])))


class TrainLoop:
    """Runs the epochs of ``setup`` from ``state``'s step to the end: train steps, metric logs,
    selection evaluations, checkpoints. Holds what changes while training: the state, the step,
    the metrics not yet fetched, the throughput clock and the recent selection evaluations
    (``history``, for ``selection.selection_score``)."""

    def __init__(self, setup: RunSetup, state: TrainState, history: list[dict] | None = None):
        self.setup = setup
        self.state = state
        self.history = list(history or [])
        self.step = int(jax.device_get(state.step))
        self.pending = _PendingMetrics()
        self.tick, self.tick_step = time.time(), self.step
        data, trainer = setup.data, setup.trainer
        self.selection = evaluate.Evaluator(
            trainer.eval_step, data.splits.selection, data.selection, data.layout,
            setup.config.train.eval_batch_size, trainer.mesh,
            decoding_config=setup.config.decoding) if data.selection else None
        self.bar = None

    def run(self) -> None:
        """Trains to the end of the last epoch."""
        setup, train_config = self.setup, self.setup.config.train
        steps_per_epoch = setup.steps_per_epoch
        self.bar = tqdm.tqdm(total=setup.total_steps, initial=self.step, unit="step",
                             dynamic_ncols=True, disable=jax.process_index() != 0, desc="train")
        try:
            first_epoch, skip = divmod(self.step, steps_per_epoch)
            for epoch in range(first_epoch, train_config.num_epochs):
                stream = input_pipeline.batch_stream(
                    setup.data.train, setup.data.layout, train_config.batch_size,
                    shuffle=train_config.shuffle, seed=train_config.seed, epoch=epoch,
                    shards=sharding.local_batch_shards(setup.trainer.mesh))
                for index, local in enumerate(stream):
                    if index < skip:
                        continue
                    self.train_step(local)
                    if index == steps_per_epoch - 1:
                        break  # the epoch's end is handled below
                    self.periodic_actions()
                skip = 0
                self.flush()
                self.select()
                self.save_latest()
        finally:
            self.bar.close()

    def train_step(self, local) -> None:
        """One update on this process's share ``local`` of the global batch."""
        self.state, step_metrics = self.setup.trainer.train_step(
            self.state, input_pipeline.global_batch(local, self.setup.trainer.mesh))
        self.step += 1
        self.pending.add(self.step, step_metrics)
        self.bar.update(1)

    def periodic_actions(self) -> None:
        """Logging, selection and checkpointing every ``train.*_every_steps`` (within an
        epoch)."""
        train_config, step = self.setup.config.train, self.step
        if train_config.log_every_steps and step % train_config.log_every_steps == 0:
            self.flush()
        if train_config.eval_every_steps and step % train_config.eval_every_steps == 0:
            self.flush()
            self.select()
        if train_config.checkpoint_every_steps and step % train_config.checkpoint_every_steps == 0:
            self.flush()
            self.save_latest()

    def flush(self) -> None:
        """Fetches the pending step metrics and logs their means with the throughput and the
        parameters' norm now; raises TrainingDiverged where that norm is not finite."""
        means = self.pending.fetch(self.setup.last_good)
        if means is None:
            return
        param_norm = float(self.setup.trainer.param_norm(self.state.params))
        if not np.isfinite(param_norm):
            raise TrainingDiverged(
                f"training diverged by step {self.step}: param_norm={param_norm} (NaN or inf). "
                f"Stopped before saving anything from it; {self.setup.last_good()}")
        elapsed = time.time() - self.tick
        rate = (self.step - self.tick_step) / elapsed if elapsed > 0 else 0.0
        self.tick, self.tick_step = time.time(), self.step
        pairs_per_step = self.setup.config.train.batch_size
        self.setup.log.write(self.step, "train",
                             {**means, "param_norm": param_norm, "steps_per_second": rate,
                              "pairs_per_second": rate * pairs_per_step},
                             epoch=self.step / self.setup.steps_per_epoch)
        self.bar.set_postfix(loss=f"{means['loss/total']:.4f}", refresh=False)

    def select(self) -> None:
        """Scores the selection split, logs it and saves the best checkpoints it improves;
        without a selection split (dev_all), saves the parameters as the selected checkpoint."""
        setup, step = self.setup, self.step
        if self.selection is None:
            setup.ckpts.save_final(step, self.state.params, setup.meta(step))
            return
        splits = setup.data.splits
        name = splits.selection_name
        evaluation = self.selection.run(self.state.params)
        scalars = evaluation.scalars
        if splits.protocol == "dev_cv":  # the held-out fold's tiers, curated and implicit
            scalars.update(evaluate.marker_scalars(
                evaluate.marker_split(splits, name, splits.selection, evaluation.records)))
        train_config = setup.config.train
        self.history = [*self.history, {k: scalars[k] for k in ("consistency", "verifiability")}
                        ][-train_config.selection_window:]
        scalars["selection_score"] = selection.selection_score(
            self.history, train_config.selection, train_config.selection_window)
        setup.log.write(step, name, scalars, epoch=step / setup.steps_per_epoch)
        improved = setup.ckpts.save_if_best(step, self.state.params, setup.meta(step, scalars))
        logging.info("step %d %s: accuracy %.3f consistency %.3f verifiability %.3f%s", step,
                     name, scalars["accuracy"], scalars["consistency"], scalars["verifiability"],
                     f" (new {', '.join(improved)})" if improved else "")

    def save_latest(self) -> None:
        """Saves the state as the latest checkpoint (for resuming)."""
        meta = {**self.setup.meta(self.step), "selection_history": self.history}
        self.setup.ckpts.save_latest(self.step, self.state.params, self.state.opt_state, meta)


def _final_reports(setup: RunSetup) -> dict[str, Any]:
    """Scores the best checkpoints on test; writes reports/ (the selected checkpoint) and
    reports/best_accuracy/ with ``evaluate.write_report_set``.

    Parameters come from ``checkpoints.restore_for_eval`` (the path evaluation takes) on the
    training mesh, so the trainer's eval step, compiled for those shardings, is reused.
    """
    config, data, splits = setup.config, setup.data, setup.data.splits
    if not data.test:
        logging.info("protocol %s: test is not scored (the held-out fold's scores are in "
                     "metrics.jsonl)", splits.protocol)
        return {}
    tester = evaluate.Evaluator(
        setup.trainer.eval_step, splits.test, data.test, data.layout,
        config.train.eval_batch_size, setup.trainer.mesh, explain=True,
        decoding_config=setup.config.decoding)
    results, scored_steps = {}, {}
    kinds = [(checkpoints.SELECTED, ""), (checkpoints.BEST_ACCURACY, checkpoints.BEST_ACCURACY)]
    for kind, subdir in kinds[:1] if not data.selection else kinds:  # dev_all: the last step
        restored = checkpoints.restore_for_eval(str(setup.workdir), kind,
                                                mesh=setup.trainer.mesh, config=config)
        if restored.step not in scored_steps:
            scored_steps[restored.step] = tester.run(restored.params)
        evaluation = scored_steps[restored.step]
        scores = evaluation.scores
        results[kind] = scores
        setup.log.write(restored.step, "test", evaluation.scalars, checkpoint=kind)
        logging.info("test (%s, step %d, protocol %s): accuracy %.3f consistency %.3f "
                     "verifiability %.3f", kind, restored.step, splits.protocol,
                     scores["accuracy"], scores["consistency"], scores["verifiability"])
        if jax.process_index() == 0:
            evaluate.write_report_set(setup.workdir / "reports" / subdir, "test", evaluation,
                                      evaluate.report_metadata(restored, splits), splits,
                                      splits.test)
    return results[checkpoints.SELECTED]
