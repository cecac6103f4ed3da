"""The original's optimizer step: ``transformers.AdamW`` and torch's gradient clipping.

``hf_adamw`` and ``torch_clip_by_global_norm`` are optax transformations; ``train.optimizer =
"hf_adamw"`` chooses both (``trip_jax.training.optimizers``). Details: docs/fidelity.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

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


def torch_clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``torch.nn.utils.clip_grad_norm_``: scales by min(1, max_norm / (norm + 1e-6)).

    ``update(..., grad_norm=None)``: the updates' global norm (``optax.tree.norm``) if
    already computed."""

    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
        scale = jnp.minimum(1.0, max_norm / (norm + TORCH_CLIP_EPS))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)
