"""The optimizer of a run: AdamW by name, gradient clipping, the learning-rate schedule.

``make_optimizer(config.train, total_steps)`` returns (optimizer, encoder schedule): optax's AdamW
and clip ("adamw") or the original's (``trip_jax.reference.optimizer``, "hf_adamw"), chosen once
by ``ADAMW``; ``update`` takes the gradients' norm as ``grad_norm``. Details: docs/fidelity.md.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from trip_jax.config.sections import Schedule, choices_of
from trip_jax.reference import optimizer as reference

SCHEDULES: tuple[str, ...] = choices_of(Schedule)  # train.schedule


def global_norm(tree) -> jax.Array:
    """The Euclidean norm of all the arrays of ``tree`` together (``optax.tree.norm``)."""
    return optax.tree.norm(tree)


def optax_clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``optax.clip_by_global_norm`` (the same operations, so the same bits): scales by
    max_norm / norm when norm >= max_norm. ``update(..., grad_norm=None)``: the updates'
    ``global_norm`` if already computed."""

    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        norm = global_norm(updates) if grad_norm is None else grad_norm
        keep = jnp.squeeze(norm < max_norm)
        clip = lambda g: jax.lax.select(keep, g, (g / norm.astype(g.dtype)) * max_norm)
        return jax.tree.map(clip, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


# train.optimizer -> (its AdamW, the gradient clipping that goes with it). Both are called
# with the same arguments: (learning_rate, *, b1, b2, eps, weight_decay) and (max_norm).
ADAMW: dict[str, tuple[Callable[..., optax.GradientTransformation],
                       Callable[[float], optax.GradientTransformationExtraArgs]]] = {
    "adamw": (optax.adamw, optax_clip_by_global_norm),
    # transformers.AdamW after torch.nn.utils.clip_grad_norm_, as the original trained.
    "hf_adamw": (reference.hf_adamw, reference.torch_clip_by_global_norm),
}
OPTIMIZERS: tuple[str, ...] = tuple(ADAMW)  # train.optimizer


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

    # train.optimizer, chosen once: optax's AdamW and clip, or the original's (``ADAMW``).
    make_adamw, make_clip = ADAMW[train_config.optimizer]

    def configured(rate):
        return make_adamw(rate, b1=train_config.adam_b1, b2=train_config.adam_b2,
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
        return optax.chain(make_clip(train_config.grad_clip_norm), tx), schedule
    return optax.with_extra_args_support(tx), schedule


def _encoder_or_heads(params) -> dict:
    """Labels the top-level parameter groups for ``optax.multi_transform``."""
    return {name: jax.tree.map(lambda _: "encoder" if name == "encoder" else "heads", group)
            for name, group in params.items()}
