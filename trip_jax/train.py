"""Training: train state, optimizer, the jitted train step, the loop, and the final test report.

``train_and_evaluate(config, workdir)`` trains on the protocol's train pairs, evaluates on its
selection pairs after every epoch (and every ``eval_every_steps``) with ``evaluate.Evaluator``,
keeps the latest and the best checkpoints, then scores the best-verifiability and best-accuracy
checkpoints on test and writes the reports (``evaluate.write_checkpoint_report``). Data comes from
``trip_jax.input_pipeline``; ``build_trainer`` assembles the model's optimizer, state shardings and
jitted steps (the benchmarks use it too). Re-running the same command resumes from the latest
checkpoint and reaches the same parameters as an uninterrupted run: the data order depends only on
(seed, epoch) and the dropout key only on (seed, step).

Outputs in the workdir: ``metrics.jsonl`` and ``tensorboard/`` (``trip_jax.metric_log``),
``checkpoints/`` (``trip_jax.checkpoints``), ``reports/`` (``trip_jax.evaluate``).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from absl import logging
from etils import epath

from trip_jax import (builders, checkpoints, decoding, evaluate, input_pipeline, losses,
                      optimizers, selection, sharding, workdir_lock)
from trip_jax.input_pipeline import RunData
from trip_jax.metric_log import MetricLog

SCHEDULES: tuple[str, ...] = ("constant", "warmup_linear", "warmup_cosine")


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training: step counter, parameters, optimizer state."""

    step: jax.Array
    params: Any
    opt_state: Any


class TrainingDiverged(FloatingPointError):
    """The loss (or the gradient or parameter norm) became NaN or infinite."""


# ------------------------------------------------------------------------------------------
# Optimizer and train state.

def learning_rate_schedule(train_config, total_steps: int, lr: float | None = None
                           ) -> optax.Schedule:
    """The learning rate per step: constant, or linear warm-up then linear/cosine decay to 0;
    peak ``lr`` (default ``train_config.learning_rate``)."""
    lr = train_config.learning_rate if lr is None else lr
    kind = train_config.schedule
    if kind not in SCHEDULES:
        raise ValueError(f"unknown train.schedule {kind!r}; expected one of {SCHEDULES}")
    if kind == "constant":
        return optax.constant_schedule(lr)
    warmup = max(1, min(total_steps - 1, round(train_config.warmup_fraction * total_steps)))
    if kind == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup),
         optax.linear_schedule(lr, 0.0, max(1, total_steps - warmup))], [warmup])


def make_optimizer(train_config, total_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW, global-norm clipping (docs/reference.md "Training"); returns (optimizer, encoder lr
    schedule). ``train.head_learning_rate`` > 0 gives the parameters outside the encoder
    (state heads, projections, detector: trained from scratch) their own peak rate;
    ``train.freeze_encoder`` leaves the encoder parameters unchanged (no optimizer state)."""
    schedule = learning_rate_schedule(train_config, total_steps)

    # train.optimizer: "adamw" (optax) or "hf_adamw" (transformers.AdamW, the reference's).
    name = train_config.optimizer

    def adamw(rate):
        return optimizers.adamw(name, rate, b1=train_config.adam_b1, b2=train_config.adam_b2,
                                eps=train_config.adam_eps, weight_decay=train_config.weight_decay)

    if train_config.head_learning_rate > 0 or train_config.freeze_encoder:
        # head_learning_rate 0 (None here): the heads share the encoder's peak rate.
        heads = learning_rate_schedule(train_config, total_steps,
                                       train_config.head_learning_rate or None)
        encoder = optax.set_to_zero() if train_config.freeze_encoder else adamw(schedule)
        adamw = optax.multi_transform({"encoder": encoder, "heads": adamw(heads)},
                                      _encoder_or_heads)
    else:
        adamw = adamw(schedule)
    if train_config.grad_clip_norm > 0:
        clip = optimizers.clip_by_global_norm(name, train_config.grad_clip_norm)
        return optax.chain(clip, adamw), schedule
    return adamw, schedule


def _encoder_or_heads(params) -> dict:
    """Labels the top-level parameter groups for ``optax.multi_transform``."""
    return {name: jax.tree.map(lambda _: "encoder" if name == "encoder" else "heads", group)
            for name, group in params.items()}


def _check_encoder_params(expected, given, source: str) -> None:
    """Raises a clear error when pretrained encoder parameters do not fit the model."""
    def shapes(tree):
        return {jax.tree_util.keystr(k): tuple(np.shape(v))
                for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    want, got = shapes(expected), shapes(given)
    bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if bad:
        raise ValueError(f"encoder weights from {source!r} do not fit the model: "
                         + "; ".join(f"{k}: model {want.get(k)}, weights {got.get(k)}"
                                     for k in bad[:8]))


def _init_fn(config, model, tx) -> Callable:
    """``init(rng, encoder_params or None) -> TrainState`` (traced: under jit or eval_shape)."""
    max_sentences = config.data.max_sentences

    def init(rng, encoder):
        params = builders.init_params(model, rng, max_sentences)
        if encoder is not None:
            params = {**params, "encoder": encoder}
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params))

    return init


def abstract_train_state(config, model, tx: optax.GradientTransformation, mesh
                         ) -> tuple[TrainState, Any]:
    """Shapes and shardings of the train state, computed without allocating it."""
    abstract = jax.eval_shape(_init_fn(config, model, tx), jax.random.key(0), None)
    return abstract, sharding.tree_shardings(mesh, abstract, config.mesh.fsdp_min_size)


def create_train_state(config, model, tx: optax.GradientTransformation, mesh,
                       encoder_params=None) -> tuple[TrainState, Any]:
    """Initialises the train state directly in its shardings; returns (state, shardings).

    ``encoder_params`` (pretrained, host arrays) replace the random encoder initialisation.
    """
    abstract, shardings = abstract_train_state(config, model, tx, mesh)
    if encoder_params is not None:
        _check_encoder_params(abstract.params["encoder"], encoder_params, config.model.encoder)
    init = jax.jit(_init_fn(config, model, tx), out_shardings=shardings)
    return init(jax.random.key(config.train.seed), encoder_params), shardings


def init_params_from(config, params):
    """Returns ``params`` with every parameter taken from the checkpoint
    ``train.init_from_checkpoint`` of the run in ``train.init_from`` whose path (e.g.
    ``['detector']['conflict_out']['kernel']``) does not match the regex ``train.init_skip``
    and that the earlier run's model has; the others keep their fresh initialisation (logged).

    Another encoder or tokenizer, or a parameter whose shape differs from the earlier run's, is
    an error; another data split (protocol, held-out slice) is a warning, since the earlier run
    may have trained on this run's selection pairs. The earlier run's parameters land on the
    shardings of ``params``; the optimizer state stays fresh.
    """
    train_config = config.train
    source = checkpoints.restore_for_eval(train_config.init_from,
                                          train_config.init_from_checkpoint)
    for key in ("encoder", "tokenizer"):
        if source.config.model[key] != config.model[key]:
            raise ValueError(f"train.init_from: {train_config.init_from} was trained with "
                             f"model.{key}={source.config.model[key]!r}, this run has "
                             f"{config.model[key]!r}")
    split_keys = ("data_dir", "protocol", "holdout_fraction", "holdout_seed", "max_pairs")
    changed = [k for k in split_keys if source.config.data[k] != config.data[k]]
    if changed:
        logging.warning("train.init_from: %s used other data settings (%s): it may have trained "
                        "on this run's selection pairs", train_config.init_from,
                        ", ".join(f"data.{k}={source.config.data[k]!r}" for k in changed))
    loaded = {jax.tree_util.keystr(path): leaf
              for path, leaf in jax.tree_util.tree_leaves_with_path(source.params)}
    skip = re.compile(train_config.init_skip) if train_config.init_skip else None
    taken, fresh = [], []

    def pick(path, leaf):
        name = jax.tree_util.keystr(path)
        if name not in loaded or (skip is not None and skip.search(name)):
            fresh.append(name)
            return leaf
        if np.shape(loaded[name]) != np.shape(leaf):
            raise ValueError(f"train.init_from: {name} has shape {np.shape(loaded[name])} in "
                             f"{train_config.init_from} but {np.shape(leaf)} in this model")
        taken.append(name)
        return jax.device_put(loaded[name].astype(leaf.dtype), leaf.sharding)

    params = jax.tree_util.tree_map_with_path(pick, params)
    # One entry per top-level group: "detector (18)" rather than 18 paths.
    groups = collections.Counter(name.split("]")[0] + "]" for name in fresh)
    logging.info("train.init_from: %d parameters from %s (%s checkpoint, step %d, protocol "
                 "%s); freshly initialised: %s", len(taken), train_config.init_from,
                 source.kind, source.step, source.meta.get("protocol"),
                 ", ".join(f"{g} ({n})" for g, n in groups.items()) or "none")
    return params


# ------------------------------------------------------------------------------------------
# Steps.

def _global_norm(tree) -> jax.Array:
    """Euclidean norm of all the arrays of a tree together."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def make_train_step(model, tx, schedule, loss_config: losses.LossConfig, mesh, state_shardings,
                    seed: int, *, freeze_encoder: bool = False) -> Callable:
    """Returns ``step(state, batch) -> (state, metrics)``: one jitted, sharded update.

    The state is donated; the dropout key is ``fold_in(key(seed) split, step)``, so a resumed
    run draws the same masks. ``metrics["finite"]`` is False when the loss, the gradient norm or
    the updated parameters are not finite. ``freeze_encoder``: no gradient flows into the
    encoder (its backward pass is not computed; the optimizer must leave it unchanged too).
    """
    dropout_key = jax.random.split(jax.random.key(seed))[1]

    def step(state: TrainState, batch):
        rng = jax.random.fold_in(dropout_key, state.step)

        def loss_fn(params):
            if freeze_encoder:
                params = {**params, "encoder": jax.lax.stop_gradient(params["encoder"])}
            outputs = model.apply({"params": params}, batch, deterministic=False,
                                  rngs={"dropout": rng})
            return losses.tiered_loss(outputs, batch, loss_config)

        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm, param_norm = _global_norm(grads), _global_norm(params)
        out = {f"loss/{k}": v for k, v in parts.items()}
        out.update(grad_norm=grad_norm, param_norm=param_norm,
                   learning_rate=schedule(state.step),
                   finite=jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm))
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), out

    return jax.jit(step,
                   in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(state_shardings, sharding.replicated(mesh)),
                   donate_argnums=(0,))


# ------------------------------------------------------------------------------------------
# Assembly.

@dataclasses.dataclass(frozen=True)
class Trainer:
    """One model's training pieces, assembled once (``build_trainer``): the optimizer and its
    schedule, the train state's shardings, the jitted train and eval steps."""

    config: ml_collections.ConfigDict
    model: Any
    mesh: jax.sharding.Mesh
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    state_shardings: Any
    train_step: Callable
    eval_step: Callable

    def fresh_state(self, encoder_params=None) -> TrainState:
        """A new train state (``create_train_state``), in ``state_shardings``."""
        state, _ = create_train_state(self.config, self.model, self.tx, self.mesh,
                                      encoder_params)
        return state

    def abstract_state(self) -> TrainState:
        """Shapes of the train state, without allocating it."""
        return abstract_train_state(self.config, self.model, self.tx, self.mesh)[0]


def build_trainer(config, model, mesh, total_steps: int) -> Trainer:
    """Assembles ``model``'s optimizer (for ``total_steps``), state shardings, train step and
    eval step (``evaluate.make_eval_step``) on ``mesh``."""
    tx, schedule = make_optimizer(config.train, total_steps)
    _, shardings = abstract_train_state(config, model, tx, mesh)
    loss_config = losses.LossConfig.from_mapping(config.loss)
    train_step = make_train_step(model, tx, schedule, loss_config, mesh, shardings,
                                 config.train.seed, freeze_encoder=config.train.freeze_encoder)
    eval_step = evaluate.make_eval_step(model, loss_config, mesh, shardings.params)
    return Trainer(config, model, mesh, tx, schedule, shardings, train_step, eval_step)


def _check_batch_size(batch_size: int, mesh) -> None:
    shards = sharding.num_batch_shards(mesh)
    if batch_size % shards:
        raise ValueError(f"train.batch_size={batch_size} does not split over the {shards} "
                         f"devices of the mesh; use a multiple of {shards} (or a smaller mesh)")


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
                    f"grad_norm={float(values['grad_norm'])}, "
                    f"param_norm={float(values['param_norm'])} (NaN or inf). Stopped before "
                    f"saving anything from it; {last_good()}")
        keys = [k for k in host[0] if k != "finite"]
        return {k: float(np.mean([h[k] for h in host])) for k in keys}


@dataclasses.dataclass
class RunSetup:
    """What one training run works with; fixed for the whole run."""

    config: ml_collections.ConfigDict
    workdir: epath.Path
    trainer: Trainer
    data: RunData
    hf_config: Any
    ckpts: checkpoints.RunCheckpoints
    log: MetricLog
    decoding: decoding.DecodingConfig  # how the selection and test evaluations decode

    @property
    def steps_per_epoch(self) -> int:
        """Train steps (batches) per epoch."""
        return input_pipeline.num_batches(len(self.data.train), self.config.train.batch_size)

    @property
    def total_steps(self) -> int:
        """Train steps of the whole run."""
        return self.steps_per_epoch * self.config.train.num_epochs

    def meta(self, step: int, scores=None) -> dict:
        """A checkpoint's metadata (``trip_jax.checkpoints``)."""
        splits = self.data.splits
        return {"step": step, "epoch": step / self.steps_per_epoch, "protocol": splits.protocol,
                "selection_split": splits.selection_name, "metrics": dict(scores or {}),
                "config": checkpoints.config_to_dict(self.config),
                "encoder_config": self.hf_config.to_dict()}

    def last_good(self) -> str:
        """Where the last good checkpoint is (for the divergence message)."""
        latest = self.ckpts.latest_step()
        where = self.workdir / "checkpoints" / checkpoints.LATEST
        return ("no checkpoint had been saved yet" if latest is None else
                f"the last good checkpoint is step {latest} in {where}, intact")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) in ``workdir``, then scores the best checkpoints on test.

    Returns the test metrics of the best-verifiability checkpoint. The run holds the workdir's
    lock (``trip_jax.workdir_lock``) from before it writes anything: WorkdirLocked, with the
    workdir untouched, when another run holds it.
    """
    started = time.time()
    selection.check_selection(config.train.selection, config.train.selection_window)
    decoding_config = decoding.DecodingConfig.from_mapping(config.decoding)  # fails early
    workdir = epath.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir_lock.acquire_for_run(workdir)
    try:
        return _train_and_evaluate(config, workdir, decoding_config, started)
    finally:
        if lock is not None:
            lock.release()


def _train_and_evaluate(config, workdir: epath.Path, decoding_config, started: float
                        ) -> dict[str, Any]:
    """``train_and_evaluate`` once the workdir is locked."""
    mesh = sharding.create_mesh(config.mesh)
    _check_batch_size(config.train.batch_size, mesh)
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
    setup = RunSetup(config, workdir, trainer, data, hf_config, ckpts, log, decoding_config)
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
    abstract, shardings = trainer.abstract_state(), trainer.state_shardings
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
            decoding_config=setup.decoding)
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
            self.state, sharding.global_batch(local, self.setup.trainer.mesh))
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
        """Fetches the pending step metrics and logs their means with the throughput."""
        means = self.pending.fetch(self.setup.last_good)
        if means is None:
            return
        elapsed = time.time() - self.tick
        rate = (self.step - self.tick_step) / elapsed if elapsed > 0 else 0.0
        self.tick, self.tick_step = time.time(), self.step
        pairs_per_step = self.setup.config.train.batch_size
        self.setup.log.write(self.step, "train",
                             {**means, "steps_per_second": rate,
                              "pairs_per_second": rate * pairs_per_step},
                             epoch=self.step / self.setup.steps_per_epoch)
        self.bar.set_postfix(loss=f"{means['loss/total']:.4f}", refresh=False)

    def select(self) -> None:
        """Scores the selection split, logs it and saves the best checkpoints it improves."""
        setup, step = self.setup, self.step
        name = setup.data.splits.selection_name
        scalars = self.selection.run(self.state.params).scalars
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
    """Scores the best checkpoints on test; writes reports/ (best verifiability) and
    reports/best_accuracy/ with ``evaluate.write_checkpoint_report``.

    Parameters come from ``checkpoints.restore_for_eval`` (the path evaluation takes) on the
    training mesh, so the trainer's eval step, compiled for those shardings, is reused.
    """
    config, data, splits = setup.config, setup.data, setup.data.splits
    tester = evaluate.Evaluator(
        setup.trainer.eval_step, splits.test, data.test, data.layout,
        config.train.eval_batch_size, setup.trainer.mesh, explain=True,
        decoding_config=setup.decoding)
    results, scored_steps = {}, {}
    for kind, subdir in ((checkpoints.BEST_VERIFIABILITY, ""),
                         (checkpoints.BEST_ACCURACY, checkpoints.BEST_ACCURACY)):
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
            evaluate.write_checkpoint_report(setup.workdir / "reports" / subdir, "test",
                                             evaluation, restored, splits, splits.test)
    return results[checkpoints.BEST_VERIFIABILITY]
