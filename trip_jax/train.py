"""Training: train state, the jitted train and eval steps, the loop, and the final test report.

``train_and_evaluate(config, workdir)`` trains on the protocol's train pairs, evaluates on its
selection pairs after every epoch (and every ``eval_every_steps``), keeps the latest and the best
checkpoints, then scores the best-verifiability and best-accuracy checkpoints on test and writes
the reports. Re-running the same command resumes from the latest checkpoint and reaches the same
parameters as an uninterrupted run: the data order depends only on (seed, epoch) and the dropout
key only on (seed, step).

Outputs in the workdir: ``metrics.jsonl`` (one JSON object per log/eval event), ``tensorboard/``
(event files), ``checkpoints/`` (``trip_jax.checkpoints``), ``reports/`` (``trip_jax.reports``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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

from trip_jax import (builders, checkpoints, explain, losses, metrics, optimizers, protocol,
                      reports, sharding)
from trip_jax.data import batching, features
from trip_jax.data.features import Buckets, EncodedPair
from trip_jax.data.types import StoryPair

SCHEDULES: tuple[str, ...] = ("constant", "warmup_linear", "warmup_cosine")
# Model outputs and batch arrays an evaluation needs on the host.
_PREDICTION_KEYS = ("pre_pred", "eff_pred", "conflict_prob", "story_pred", "story_score")
_LABEL_KEYS = ("pre_label", "eff_label", "conflict_label", "story_label", "row_mask",
               "pair_mask", "pair_index")
# Selection/test metrics that are logged as scalars.
_SCALAR_METRICS = ("accuracy", "consistency", "verifiability", "precondition_f1", "effect_f1",
                   "conflict_f1", "conflict_f1_positive")


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
    """AdamW with global-norm clipping (DESIGN.md §2); returns (optimizer, the encoder's lr
    schedule). ``train.head_learning_rate`` > 0 gives the parameters outside the encoder
    (state heads, projections, detector: trained from scratch) their own peak rate;
    ``train.freeze_encoder`` leaves the encoder parameters unchanged (no optimizer state)."""
    schedule = learning_rate_schedule(train_config, total_steps)

    # train.optimizer: "adamw" (optax) or "hf_adamw" (transformers.AdamW, the reference's).
    name = train_config.get("optimizer", "adamw")

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


def make_eval_step(model, loss_config: losses.LossConfig, mesh, param_shardings) -> Callable:
    """Returns ``eval_step(params, batch)``: predictions, labels and losses, replicated on every
    device (so every process can score the whole batch)."""

    def step(params, batch):
        outputs = model.apply({"params": params}, batch, deterministic=True)
        _, parts = losses.tiered_loss(outputs, batch, loss_config)
        out = {k: outputs[k] for k in _PREDICTION_KEYS}
        out.update({k: batch[k] for k in _LABEL_KEYS})
        out["loss"] = parts
        return out

    return jax.jit(step, in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=sharding.replicated(mesh))


# ------------------------------------------------------------------------------------------
# Data.

@dataclasses.dataclass
class RunData:
    """The protocol's splits, tokenized."""

    splits: protocol.ProtocolSplits
    tokenizer: Any
    train: list[EncodedPair]
    selection: list[EncodedPair]
    test: list[EncodedPair]


def prepare_data(config) -> RunData:
    """Reads the protocol's splits, builds the tokenizer and encodes every pair."""
    splits = protocol.load_protocol_splits(config.data)
    for name, pairs in (("train", splits.train), ("selection", splits.selection),
                        ("test", splits.test)):
        if not pairs:
            raise ValueError(f"protocol {splits.protocol}: the {name} split is empty")
    everything = splits.train + splits.selection + splits.test
    tokenizer = builders.build_tokenizer(config.model, features.vocabulary_texts(everything))

    def encode(pairs):
        return features.encode_pairs(pairs, tokenizer, max_sentences=config.data.max_sentences,
                                     max_length=config.data.max_length or None)

    return RunData(splits, tokenizer, encode(splits.train), encode(splits.selection),
                   encode(splits.test))


def batch_stream(encoded: Sequence[EncodedPair], config, batch_size: int, *, shuffle: bool,
                 epoch: int) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches of one epoch, in the order fixed by (train.seed, epoch)."""
    return batching.batches(
        encoded, batch_size, shuffle=shuffle, seed=config.train.seed, epoch=epoch,
        layout=config.data.layout, process_index=jax.process_index(),
        process_count=jax.process_count(), buckets=Buckets(**config.data.buckets),
        seq_len=config.data.seq_len or None, max_sentences=config.data.max_sentences,
        short_seq_len=config.data.short_seq_len or None)


def _check_batch_size(name: str, batch_size: int, mesh) -> None:
    shards = sharding.num_batch_shards(mesh)
    if batch_size % shards:
        raise ValueError(f"train.{name}={batch_size} does not split over the {shards} devices of "
                         f"the mesh; use a multiple of {shards} (or a smaller mesh)")


# ------------------------------------------------------------------------------------------
# Evaluation.

def _pad_entities(value: np.ndarray, entities: int) -> np.ndarray:
    """Pads axis 2 (E) of a [B, 2, E, S, ...] array with zeros (padding rows)."""
    extra = entities - value.shape[2]
    if extra == 0:
        return value
    widths = [(0, 0)] * value.ndim
    widths[2] = (0, extra)
    return np.pad(value, widths)


def evaluate(eval_step: Callable, params, encoded: Sequence[EncodedPair], config, mesh,
             pair_ids: Sequence[str], *, pairs: Sequence[StoryPair] | None = None
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scores ``params`` on ``encoded`` pairs; returns (tiered metrics + mean losses, per-pair
    records in dataset order).

    A record holds the pair id, its label, the predicted story and ``metrics.outcome_record``;
    given ``pairs`` (the typed pairs ``encoded`` was built from), also the explanation of
    ``explain.explain_pair`` under "explanation" (conflicting pair and the states behind it).
    """
    outputs, loss_sums, real_pairs = [], {}, 0
    for local in batch_stream(encoded, config, config.train.eval_batch_size, shuffle=False,
                              epoch=0):
        out = jax.device_get(eval_step(params, sharding.global_batch(local, mesh)))
        n = int(out["pair_mask"].sum())
        real_pairs += n
        for key, value in out.pop("loss").items():
            loss_sums[key] = loss_sums.get(key, 0.0) + float(value) * n
        outputs.append(out)
    entities = max(o["row_mask"].shape[2] for o in outputs)
    merged = {}
    for key in outputs[0]:
        parts = [o[key][o["pair_mask"]] for o in outputs]
        if parts[0].ndim >= 4:
            parts = [_pad_entities(p, entities) for p in parts]
        merged[key] = np.concatenate(parts)
    order = np.argsort(merged["pair_index"])
    merged = {k: v[order] for k, v in merged.items()}
    args = dict(story_label=merged["story_label"], story_pred=merged["story_pred"],
                conflict_label=merged["conflict_label"], conflict_prob=merged["conflict_prob"],
                pre_label=merged["pre_label"], pre_pred=merged["pre_pred"],
                eff_label=merged["eff_label"], eff_pred=merged["eff_pred"],
                mask=merged["row_mask"])
    scores = metrics.tiered_metrics(**args)
    scores.update({f"loss/{k}": v / max(real_pairs, 1) for k, v in loss_sums.items()})
    outcomes = metrics.pair_outcomes(**args)
    records = []
    for n, i in enumerate(merged["pair_index"]):
        story_pred = int(merged["story_pred"][n])
        record = {"pair_id": pair_ids[int(i)], "label": int(merged["story_label"][n]),
                  "predicted_story": story_pred, **metrics.outcome_record(outcomes, n)}
        if pairs is not None:
            stories = pairs[int(i)].stories
            record["explanation"] = explain.explain_pair(
                story_pred, merged["conflict_prob"][n], merged["pre_pred"][n],
                merged["eff_pred"][n], [s.entities for s in stories],
                [s.sentences for s in stories])
        records.append(record)
    return scores, records


def scalar_metrics(scores: Mapping[str, Any]) -> dict[str, float]:
    """The scalar entries of an evaluation (for logs and checkpoint metadata)."""
    keys = [k for k in scores if k in _SCALAR_METRICS or k.startswith("loss/")]
    return {k: float(scores[k]) for k in keys}


# ------------------------------------------------------------------------------------------
# Logging.

class MetricLog:
    """Writes scalars to ``workdir/metrics.jsonl`` and TensorBoard (process 0 only)."""

    def __init__(self, workdir: str):
        self.enabled = jax.process_index() == 0
        self.path = epath.Path(workdir) / "metrics.jsonl"
        self.writer = None
        if self.enabled:
            import tensorboardX

            self.writer = tensorboardX.SummaryWriter(str(epath.Path(workdir) / "tensorboard"))

    def write(self, step: int, split: str, scalars: Mapping[str, Any], **extra) -> None:
        """Logs one event: ``split`` is "train", the selection split's name, or "test"."""
        if not self.enabled:
            return
        record = {"step": step, "split": split, **extra, **reports.to_jsonable(dict(scalars)),
                  "time": time.time()}
        with self.path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        for key, value in scalars.items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        self.writer.flush()

    def drop_after(self, step: int) -> None:
        """Removes the records of steps after ``step``: an interrupted run logged them after its
        last checkpoint, and the run resumed from ``step`` logs them again."""
        if not self.enabled or not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        if len(kept) < len(lines):
            logging.info("metrics.jsonl: dropped %d records after step %d (logged again on "
                         "resume)", len(lines) - len(kept), step)
            self.path.write_text("".join(line + "\n" for line in kept))

    def close(self) -> None:
        """Closes the TensorBoard writer."""
        if self.writer is not None:
            self.writer.close()


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) in ``workdir``, then scores the best checkpoints on test.

    Returns the test metrics of the best-verifiability checkpoint.
    """
    workdir = str(workdir)
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    mesh = sharding.create_mesh(config.mesh)
    _check_batch_size("batch_size", config.train.batch_size, mesh)
    _check_batch_size("eval_batch_size", config.train.eval_batch_size, mesh)
    logging.info("mesh %s over %d devices (%d processes)", dict(mesh.shape), mesh.size,
                 jax.process_count())

    data = prepare_data(config)
    splits = data.splits
    logging.info("protocol %s: %d train pairs, %d selection pairs (%s), %d test pairs",
                 splits.protocol, len(data.train), len(data.selection), splits.selection_name,
                 len(data.test))
    hf_config, encoder_params = builders.build_encoder_config(config.model, data.tokenizer)
    model = builders.build_model(config, hf_config)
    checkpoints.write_run_files(workdir, config, hf_config, data.tokenizer)

    steps_per_epoch = batching.num_batches(len(data.train), config.train.batch_size)
    total_steps = steps_per_epoch * config.train.num_epochs
    tx, schedule = make_optimizer(config.train, total_steps)
    loss_config = losses.LossConfig.from_mapping(config.loss)
    ckpts = checkpoints.RunCheckpoints(workdir, keep=config.train.keep_checkpoints,
                                       async_save=config.train.async_checkpoints)
    log = MetricLog(workdir)
    try:
        state, state_shardings = _initial_state(config, model, tx, mesh, encoder_params, ckpts)
        log.drop_after(int(jax.device_get(state.step)))
        eval_step = make_eval_step(model, loss_config, mesh, state_shardings.params)
        try:
            _train_loop(config, workdir, model, tx, schedule, loss_config, mesh, state,
                        state_shardings, eval_step, data, hf_config, ckpts, log,
                        steps_per_epoch, total_steps)
        finally:
            ckpts.close()
        return _final_reports(config, workdir, mesh, eval_step, data, log)
    finally:
        log.close()


def _initial_state(config, model, tx, mesh, encoder_params, ckpts):
    """The latest checkpoint's train state when there is one, else a fresh one (with the
    parameters of ``train.init_from`` where given)."""
    if ckpts.latest_step() is None:
        state, shardings = create_train_state(config, model, tx, mesh, encoder_params)
        if config.train.init_from:
            state = state.replace(params=init_params_from(config, state.params))
        return state, shardings
    abstract, shardings = abstract_train_state(config, model, tx, mesh)
    params, opt_state, meta = ckpts.restore_latest(abstract.params, abstract.opt_state,
                                                   shardings.params, shardings.opt_state, config)
    logging.info("resuming from the checkpoint of step %d (epoch %.2f)", meta["step"],
                 meta["epoch"])
    step = jax.device_put(jnp.asarray(meta["step"], jnp.int32), shardings.step)
    return TrainState(step=step, params=params, opt_state=opt_state), shardings


def _train_loop(config, workdir, model, tx, schedule, loss_config, mesh, state, state_shardings,
                eval_step, data: RunData, hf_config, ckpts, log: MetricLog,
                steps_per_epoch: int, total_steps: int) -> None:
    """Runs the epochs from the state's step to the end, evaluating and checkpointing."""
    train_cfg = config.train
    train_step = make_train_step(model, tx, schedule, loss_config, mesh, state_shardings,
                                 train_cfg.seed, freeze_encoder=train_cfg.freeze_encoder)
    selection_ids = [p.pair_id for p in data.splits.selection]
    selection_name = data.splits.selection_name
    config_dict = checkpoints.config_to_dict(config)

    def meta(step: int, scores: Mapping[str, float] | None = None) -> dict:
        return {"step": step, "epoch": step / steps_per_epoch, "protocol": data.splits.protocol,
                "selection_split": selection_name, "metrics": dict(scores or {}),
                "config": config_dict, "encoder_config": hf_config.to_dict()}

    def last_good() -> str:
        latest = ckpts.latest_step()
        where = epath.Path(workdir) / "checkpoints" / checkpoints.LATEST
        return ("no checkpoint had been saved yet" if latest is None else
                f"the last good checkpoint is step {latest} in {where}, intact")

    pending = _PendingMetrics()
    step = int(jax.device_get(state.step))
    tick, tick_step = time.time(), step

    def flush() -> None:
        nonlocal tick, tick_step
        means = pending.fetch(last_good)
        if means is None:
            return
        elapsed = time.time() - tick
        rate = (step - tick_step) / elapsed if elapsed > 0 else 0.0
        tick, tick_step = time.time(), step
        log.write(step, "train", {**means, "steps_per_second": rate,
                                  "pairs_per_second": rate * train_cfg.batch_size},
                  epoch=step / steps_per_epoch)
        bar.set_postfix(loss=f"{means['loss/total']:.4f}", refresh=False)

    def select() -> None:
        scores, _ = evaluate(eval_step, state.params, data.selection, config, mesh, selection_ids)
        scalars = scalar_metrics(scores)
        log.write(step, selection_name, scalars, epoch=step / steps_per_epoch)
        improved = ckpts.save_if_best(step, state.params, meta(step, scalars))
        logging.info("step %d %s: accuracy %.3f consistency %.3f verifiability %.3f%s", step,
                     selection_name, scalars["accuracy"], scalars["consistency"],
                     scalars["verifiability"],
                     f" (new {', '.join(improved)})" if improved else "")

    bar = tqdm.tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True,
                    disable=jax.process_index() != 0, desc="train")
    try:
        first_epoch, skip = divmod(step, steps_per_epoch)
        for epoch in range(first_epoch, train_cfg.num_epochs):
            stream = batch_stream(data.train, config, train_cfg.batch_size,
                                  shuffle=train_cfg.shuffle, epoch=epoch)
            for index, local in enumerate(stream):
                if index < skip:
                    continue
                state, step_metrics = train_step(state, sharding.global_batch(local, mesh))
                step += 1
                pending.add(step, step_metrics)
                bar.update(1)
                if index == steps_per_epoch - 1:
                    break  # the epoch's end is handled below
                if train_cfg.log_every_steps and step % train_cfg.log_every_steps == 0:
                    flush()
                if train_cfg.eval_every_steps and step % train_cfg.eval_every_steps == 0:
                    flush()
                    select()
                if (train_cfg.checkpoint_every_steps
                        and step % train_cfg.checkpoint_every_steps == 0):
                    flush()
                    ckpts.save_latest(step, state.params, state.opt_state, meta(step))
            skip = 0
            flush()
            select()
            ckpts.save_latest(step, state.params, state.opt_state, meta(step))
    finally:
        bar.close()


def _final_reports(config, workdir, mesh, eval_step, data: RunData, log: MetricLog
                   ) -> dict[str, Any]:
    """Scores the best checkpoints on test; writes reports/ (best verifiability) and
    reports/best_accuracy/ with ``trip_jax.evaluate.write_checkpoint_report``.

    Parameters come from ``checkpoints.restore_for_eval`` (the path evaluation takes) on the
    training mesh, so ``eval_step``, compiled for those shardings, is reused.
    """
    # Imported here: trip_jax.evaluate builds on this module (eval step, batching).
    from trip_jax import evaluate as evaluation

    test_ids = [p.pair_id for p in data.splits.test]
    results, scored_steps = {}, {}
    for kind, subdir in ((checkpoints.BEST_VERIFIABILITY, ""),
                         (checkpoints.BEST_ACCURACY, checkpoints.BEST_ACCURACY)):
        restored = checkpoints.restore_for_eval(workdir, kind, mesh=mesh, config=config)
        if restored.step not in scored_steps:
            scored_steps[restored.step] = evaluate(eval_step, restored.params, data.test, config,
                                                   mesh, test_ids, pairs=data.splits.test)
        scores, records = scored_steps[restored.step]
        results[kind] = scores
        log.write(restored.step, "test", scalar_metrics(scores), checkpoint=kind)
        logging.info("test (%s, step %d, protocol %s): accuracy %.3f consistency %.3f "
                     "verifiability %.3f", kind, restored.step, data.splits.protocol,
                     scores["accuracy"], scores["consistency"], scores["verifiability"])
        if jax.process_index() == 0:
            evaluation.write_checkpoint_report(
                epath.Path(workdir) / "reports" / subdir, "test", scores, records, restored,
                data.splits, data.splits.test)
    return results[checkpoints.BEST_VERIFIABILITY]
