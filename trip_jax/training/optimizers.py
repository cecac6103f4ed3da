"""The optimizer of a run: AdamW by name, gradient clipping, the learning-rate schedule.

``make_optimizer(config.train, total_steps)`` returns (optimizer, encoder schedule): optax's AdamW
("adamw") or ``transformers.AdamW``'s ("hf_adamw"), each with its clip; ``update`` takes the
gradients' norm as ``grad_norm``. Details: docs/fidelity.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from trip_jax.config.sections import Optimizer, Schedule, choices_of

OPTIMIZERS: tuple[str, ...] = choices_of(Optimizer)  # train.optimizer
SCHEDULES: tuple[str, ...] = choices_of(Schedule)  # train.schedule
# torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing.
TORCH_CLIP_EPS = 1e-6


class HFAdamWState(NamedTuple):
    """Step count and the two moment estimates (float32, like the parameters)."""

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def _one_minus_power(decay: float, count: jax.Array) -> jax.Array:
    """1 - decay**count in float32 without the cancellation of the direct form (1 - 0.999**1
    in float32 is off by 1.3e-5 relative; transformers computes it in float64)."""
    return -jnp.expm1(count.astype(jnp.float32) * math.log(decay))


def scale_by_hf_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6
                     ) -> optax.GradientTransformation:
    """Adam direction with ``transformers.AdamW``'s epsilon placement, times -1 (the learning
    rate is applied afterwards): returns sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)."""

    def init(params):
        zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
        return HFAdamWState(count=jnp.zeros((), jnp.int32), mu=jax.tree.map(zeros, params),
                            nu=jax.tree.map(zeros, params))

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        count = state.count + 1
        correction = jnp.sqrt(_one_minus_power(b2, count)) / _one_minus_power(b1, count)
        direction = jax.tree.map(lambda m, v: correction * m / (jnp.sqrt(v) + eps), mu, nu)
        return direction, HFAdamWState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def hf_adamw(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
             eps: float = 1e-6, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """``transformers.AdamW`` (correct_bias=True) as an optax transformation.

    The update is -lr * direction - lr * weight_decay * (params - lr * direction): the weight
    decay acts on the parameters after the Adam step, as transformers applied it.
    """
    adam = scale_by_hf_adam(b1, b2, eps)
    schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

    def init(params):
        return adam.init(params)

    def update(updates, state, params=None):
        step = state.count  # the schedule sees 0, 1, ... like optax.scale_by_learning_rate
        direction, state = adam.update(updates, state)
        lr = schedule(step)
        updates = jax.tree.map(lambda d: -lr * d, direction)
        if weight_decay:
            if params is None:
                raise ValueError("hf_adamw with weight_decay needs the parameters")
            updates = jax.tree.map(lambda u, p: u - lr * weight_decay * (p + u), updates, params)
        return updates, state

    return optax.GradientTransformation(init, update)


def global_norm(tree) -> jax.Array:
    """The Euclidean norm of all the arrays of ``tree`` together (``optax.tree.norm``)."""
    return optax.tree.norm(tree)


def torch_clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``torch.nn.utils.clip_grad_norm_``: scales by min(1, max_norm / (norm + 1e-6)).

    ``update(..., grad_norm=None)``: the updates' ``global_norm`` if already computed."""

    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        norm = global_norm(updates) if grad_norm is None else grad_norm
        scale = jnp.minimum(1.0, max_norm / (norm + TORCH_CLIP_EPS))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def optax_clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``optax.clip_by_global_norm`` (the same operations, so the same bits): scales by
    max_norm / norm when norm >= max_norm. ``update(..., grad_norm=None)`` as
    ``torch_clip_by_global_norm``."""

    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        norm = global_norm(updates) if grad_norm is None else grad_norm
        keep = jnp.squeeze(norm < max_norm)
        clip = lambda g: jax.lax.select(keep, g, (g / norm.astype(g.dtype)) * max_norm)
        return jax.tree.map(clip, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def adamw(name: str, learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float, eps: float,
          weight_decay: float) -> optax.GradientTransformation:
    """The AdamW called ``name``: "adamw" (optax) or "hf_adamw" (transformers.AdamW)."""
    if name == "adamw":
        return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    if name == "hf_adamw":
        return hf_adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    raise ValueError(f"unknown train.optimizer {name!r}; expected one of {OPTIMIZERS}")


def clip_by_global_norm(name: str, max_norm: float) -> optax.GradientTransformationExtraArgs:
    """Gradient clipping that goes with optimizer ``name``: optax's for "adamw", torch's for
    "hf_adamw" (the reference clipped with torch.nn.utils.clip_grad_norm_)."""
    if name == "hf_adamw":
        return torch_clip_by_global_norm(max_norm)
    if name == "adamw":
        return optax_clip_by_global_norm(max_norm)
    raise ValueError(f"unknown train.optimizer {name!r}; expected one of {OPTIMIZERS}")


def learning_rate_schedule(train_config, total_steps: int, lr: float | None = None
                           ) -> optax.Schedule:
    """The learning rate per step: constant, or linear warm-up then linear/cosine decay to 0;
    peak ``lr`` (default ``train_config.learning_rate``)."""
    lr = train_config.learning_rate if lr is None else lr
    kind = train_config.schedule  # one of SCHEDULES (checked by the schema)
    if kind == "constant":
        return optax.constant_schedule(lr)
    warmup = max(1, min(total_steps - 1, round(train_config.warmup_fraction * total_steps)))
    if kind == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup),
         optax.linear_schedule(lr, 0.0, max(1, total_steps - warmup))], [warmup])


def make_optimizer(train_config, total_steps: int
                   ) -> tuple[optax.GradientTransformationExtraArgs, optax.Schedule]:
    """AdamW, global-norm clipping (docs/reference.md "Training"); returns (optimizer, encoder lr
    schedule). The optimizer's ``update`` accepts ``grad_norm`` (module docstring). ``train.head_learning_rate`` > 0 gives the parameters outside the encoder
    (state heads, projections, detector: trained from scratch) their own peak rate;
    ``train.freeze_encoder`` leaves the encoder parameters unchanged (no optimizer state)."""
    schedule = learning_rate_schedule(train_config, total_steps)

    # train.optimizer: "adamw" (optax) or "hf_adamw" (transformers.AdamW, the reference's).
    name = train_config.optimizer

    def configured(rate):
        return adamw(name, rate, b1=train_config.adam_b1, b2=train_config.adam_b2,
                     eps=train_config.adam_eps, weight_decay=train_config.weight_decay)

    if train_config.head_learning_rate > 0 or train_config.freeze_encoder:
        # head_learning_rate 0 (None here): the heads share the encoder's peak rate.
        heads = learning_rate_schedule(train_config, total_steps,
                                       train_config.head_learning_rate or None)
        encoder = optax.set_to_zero() if train_config.freeze_encoder else configured(schedule)
        tx = optax.multi_transform({"encoder": encoder, "heads": configured(heads)},
                                   _encoder_or_heads)
    else:
        tx = configured(schedule)
    if train_config.grad_clip_norm > 0:
        clip = clip_by_global_norm(name, train_config.grad_clip_norm)
        return optax.chain(clip, tx), schedule
    return optax.with_extra_args_support(tx), schedule


def _encoder_or_heads(params) -> dict:
    """Labels the top-level parameter groups for ``optax.multi_transform``."""
    return {name: jax.tree.map(lambda _: "encoder" if name == "encoder" else "heads", group)
            for name, group in params.items()}
