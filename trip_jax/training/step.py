"""The jitted train and eval steps and the ``Trainer`` that assembles a model's training pieces.

``build_trainer``, used by training and the benchmarks, is the one place that turns a config and a
model into the optimizer, the train state's shapes and shardings and the jitted steps, each
built once per process for equal arguments (``reuse_built``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from trip_jax.config.sections import Config
from trip_jax.data import batch_contract
from trip_jax.runtime import sharding
from trip_jax.training import losses, optimizers
from trip_jax.training.reuse import reuse_built
from trip_jax.training.state import (TrainState, abstract_train_state, create_train_state,
                                     jitted_init)


# XLA:TPU draws an RngBitGenerator's bits for the whole array on every device, then keeps the
# device's share; with this option each device draws only its share (other bits for another
# mesh). Set for train.prng_impl=unsafe_rbg on TPUs (docs/compile.md#fsdp).
PER_DEVICE_RNG_BITS = {"xla_tpu_spmd_rng_bit_generator_unsafe": True}


def step_compiler_options(mesh, prng_impl: str) -> dict[str, Any] | None:
    """The train step's XLA options: ``PER_DEVICE_RNG_BITS`` for ``unsafe_rbg`` on a TPU mesh,
    else None."""
    if prng_impl == "unsafe_rbg" and mesh.devices.flat[0].platform == "tpu":
        return PER_DEVICE_RNG_BITS
    return None


def make_train_step(model, tx, schedule, loss_config: losses.LossConfig, mesh, state_shardings,
                    seed: int, *, freeze_encoder: bool = False,
                    compiler_options: dict[str, Any] | None = None) -> Callable:
    """Returns ``step(state, batch) -> (state, metrics)``: one jitted, sharded update.

    The state is donated; the dropout key is ``fold_in(key(seed) split, step)``, so a resumed
    run draws the same masks. ``metrics["grad_norm"]`` is the gradients' global norm, computed
    once: the one the optimizer's clip uses (``optimizers.global_norm``). ``metrics["finite"]``
    is False when the loss or the gradient norm is not finite (the parameters' norm is
    ``make_param_norm``'s, on logging steps only). ``freeze_encoder``: no gradient flows into the
    encoder (its backward pass is not computed; the optimizer must leave it unchanged too).
    ``compiler_options``: XLA's, for the jit (``step_compiler_options``).
    """
    dropout_key = jax.random.split(jax.random.key(seed))[1]
    pieces = sharding.num_batch_shards(mesh)

    def step(state: TrainState, batch):
        rng = jax.random.fold_in(dropout_key, state.step)

        def loss_fn(params):
            if freeze_encoder:
                params = {**params, "encoder": jax.lax.stop_gradient(params["encoder"])}
            outputs = model.apply({"params": sharding.gathered(params, mesh)}, batch,
                                  deterministic=False, rngs={"dropout": rng}, pieces=pieces)
            return losses.tiered_loss(outputs, batch, loss_config)

        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        grad_norm = optimizers.global_norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params,
                                       grad_norm=grad_norm)
        params = optax.apply_updates(state.params, updates)
        out = {f"loss/{k}": v for k, v in parts.items()}
        out.update(grad_norm=grad_norm, learning_rate=schedule(state.step),
                   finite=jnp.isfinite(loss) & jnp.isfinite(grad_norm))
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), out

    return jax.jit(step,
                   in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(state_shardings, sharding.replicated(mesh)),
                   donate_argnums=(0,), compiler_options=compiler_options)


def make_param_norm(mesh, param_shardings) -> Callable:
    """Returns ``param_norm(params)``: the parameters' global norm (``optimizers.global_norm``),
    replicated; a program of its own, run when a log record is written, so the train step does
    not compute it every step."""
    return jax.jit(optimizers.global_norm, in_shardings=(param_shardings,),
                   out_shardings=sharding.replicated(mesh))


def make_eval_step(model, loss_config: losses.LossConfig, mesh, param_shardings) -> Callable:
    """Returns ``eval_step(params, batch)``: the contract's predictions (``PREDICTION_KEYS``),
    the logits coherent decoding reads (``batch_contract.LOGIT_KEYS``), the batch's per-pair arrays
    (``PAIR_KEYS``) and the loss terms under "loss", replicated on every device (so every process
    can score the whole batch)."""

    def step(params, batch):
        outputs = model.apply({"params": sharding.gathered(params, mesh)}, batch,
                              deterministic=True, pieces=sharding.num_batch_shards(mesh))
        _, parts = losses.tiered_loss(outputs, batch, loss_config)
        out = {k: outputs[k] for k in (*batch_contract.PREDICTION_KEYS, *batch_contract.LOGIT_KEYS)}
        out.update({k: batch[k] for k in batch_contract.PAIR_KEYS})
        out["loss"] = parts
        return out

    return jax.jit(step, in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=sharding.replicated(mesh))


def shared_eval_step(model, loss_config: losses.LossConfig, mesh, param_shardings,
                     build: Callable[[], Callable] | None = None) -> Callable:
    """``make_eval_step(...)`` (or ``build()``), built once per process for equal arguments
    (``reuse_built``)."""
    key = ("eval_step", model, loss_config, mesh, jax.tree.flatten(param_shardings))
    return reuse_built(key, build or (
        lambda: make_eval_step(model, loss_config, mesh, param_shardings)))


@dataclasses.dataclass(frozen=True)
class Trainer:
    """One model's training pieces, assembled once (``build_trainer``): the optimizer and its
    schedule, the train state's shapes and shardings, the jitted train and eval steps, the
    parameter norm (``make_param_norm``) and the state's initialisation (``jitted_init``)."""

    config: Config
    model: Any
    mesh: jax.sharding.Mesh
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    state_shardings: Any
    abstract_state: TrainState  # shapes of the train state, not allocated
    train_step: Callable
    eval_step: Callable
    param_norm: Callable
    init_state: Callable  # jitted_init: a fresh train state in state_shardings

    def fresh_state(self, encoder_params=None) -> TrainState:
        """A new train state (``create_train_state``), in ``state_shardings``."""
        state, _ = create_train_state(self.config, self.model, self.tx, self.mesh,
                                      encoder_params, (self.abstract_state, self.state_shardings),
                                      self.init_state)
        return state


def build_trainer(config, model, mesh, total_steps: int) -> Trainer:
    """Assembles ``model``'s optimizer (for ``total_steps``), state shardings, train step, eval
    step (``shared_eval_step``) and parameter norm (``make_param_norm``) on ``mesh``. The pieces
    are built once per process for equal arguments (``reuse_built``), whatever the config says
    outside what they depend on (the folds of a cross-validation differ in ``data.fold`` only)."""
    depends_on = (config.train, config.loss, config.model, config.mesh, config.data.max_sentences)
    trainer = reuse_built(("trainer", *depends_on, model, mesh, total_steps),
                          lambda: _build_trainer(config, model, mesh, total_steps))
    # A trainer found again keeps its eval step the one equal models evaluate with.
    shared_eval_step(model, config.loss, mesh, trainer.state_shardings.params,
                     lambda: trainer.eval_step)
    return dataclasses.replace(trainer, config=config)


def _build_trainer(config, model, mesh, total_steps: int) -> Trainer:
    tx, schedule = optimizers.make_optimizer(config.train, total_steps)
    abstract, shardings = abstract_train_state(config, model, tx, mesh)
    train_step = make_train_step(model, tx, schedule, config.loss, mesh, shardings,
                                 config.train.seed, freeze_encoder=config.train.freeze_encoder,
                                 compiler_options=step_compiler_options(
                                     mesh, config.train.prng_impl))
    eval_step = shared_eval_step(model, config.loss, mesh, shardings.params)
    return Trainer(config, model, mesh, tx, schedule, shardings, abstract, train_step, eval_step,
                   make_param_norm(mesh, shardings.params),
                   jitted_init(config, model, tx, shardings))
