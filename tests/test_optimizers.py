"""Tests of trip_jax.training.optimizers and trip_jax.reference.optimizer: transformers.AdamW's
update and torch's clipping, by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from trip_jax.config import sections
from trip_jax.config.messages import ConfigError
from trip_jax.reference import optimizer as reference
from trip_jax.training import optimizers
from trip_jax.training.optimizers import make_optimizer

LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-6


def hand_hf_adamw(params, grads_per_step, *, weight_decay):
    """transformers.AdamW (correct_bias=True) written out in float64 numpy, step by step."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        step_size = LR * np.sqrt(1 - B2 ** t) / (1 - B1 ** t)
        for k in p:
            g = grads[k].astype(np.float64)
            m[k] = B1 * m[k] + (1 - B1) * g
            v[k] = B2 * v[k] + (1 - B2) * g * g
            p[k] = p[k] - step_size * m[k] / (np.sqrt(v[k]) + EPS)
            p[k] = p[k] - LR * weight_decay * p[k]  # after the Adam step, on the new p
    return p


def run(tx, params, grads_per_step):
    """Applies ``tx`` for every step's gradients; returns the parameters, each as the float32
    start plus the float64 sum of the updates (so that a 1e-6 step is not lost to the rounding
    of a parameter near 1)."""
    start = params
    params = jax.tree.map(jnp.asarray, params)
    state = tx.init(params)
    moved = {k: np.zeros(v.shape, np.float64) for k, v in start.items()}
    for grads in grads_per_step:
        updates, state = tx.update(jax.tree.map(jnp.asarray, grads), state, params)
        params = optax.apply_updates(params, updates)
        moved = {k: moved[k] + np.asarray(updates[k], np.float64) for k in moved}
    return {k: start[k].astype(np.float64) + moved[k] for k in moved}


def problem(seed=0):
    """Parameters and three steps of gradients; some gradients tiny, where eps matters."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(4, 5)).astype(np.float32),
              "b": rng.normal(size=(5,)).astype(np.float32)}
    grads = []
    for _ in range(3):
        g = {k: rng.normal(size=x.shape).astype(np.float32) for k, x in params.items()}
        g["w"][0] *= 1e-5  # |g| ~ eps / sqrt(1 - b2): the two epsilon placements disagree here
        grads.append(g)
    return params, grads


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_hf_adamw_matches_the_hand_computed_update_over_three_steps(weight_decay):
    params, grads = problem()
    got = run(reference.hf_adamw(LR, B1, B2, EPS, weight_decay), params, grads)
    want = hand_hf_adamw(params, grads, weight_decay=weight_decay)
    for k in params:
        # Relative to the distance travelled: the update itself is what is compared.
        np.testing.assert_allclose(got[k] - params[k], want[k] - params[k], rtol=2e-5,
                                   atol=1e-9)


def test_hf_adamw_differs_from_optax_adamw_where_gradients_are_small():
    params, grads = problem()
    hf = run(reference.hf_adamw(LR, B1, B2, EPS), params, grads[:1])
    ox = run(optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=0.0), params, grads[:1])
    small = np.abs(hf["w"][0] - ox["w"][0]) / LR
    large = np.abs(hf["w"][1:] - ox["w"][1:]) / LR
    assert small.min() > 0.3   # step 1: eps/sqrt(1-b2) = 3.2e-5 against |g| ~ 1e-5
    assert large.max() < 1e-3  # large gradients: both are ~lr * sign(g)


def test_torch_clip_scales_by_max_norm_over_norm_plus_1e6():
    g = {"a": jnp.asarray([3.0, 4.0])}  # norm 5
    clipped, _ = reference.torch_clip_by_global_norm(1.0).update(g, optax.EmptyState())
    np.testing.assert_allclose(clipped["a"], np.asarray([3.0, 4.0]) / (5 + 1e-6), rtol=1e-7)
    small = {"a": jnp.asarray([0.3, 0.4])}  # below the limit: unchanged
    same, _ = reference.torch_clip_by_global_norm(1.0).update(small, optax.EmptyState())
    np.testing.assert_array_equal(same["a"], small["a"])


@pytest.mark.parametrize("scale", [0.1, 10.0])  # below and above the limit
def test_the_clips_take_the_norm_the_step_computed(scale):
    g = {"a": jnp.asarray([3.0, 4.0]) * scale, "b": jnp.asarray([[1.0, -2.0]]) * scale}
    norm = optimizers.global_norm(g)
    np.testing.assert_array_equal(norm, optax.tree.norm(g))
    # Given the norm, optax's clip computes the same bits as optax.clip_by_global_norm.
    ours, _ = optimizers.optax_clip_by_global_norm(1.0).update(g, optax.EmptyState(),
                                                               grad_norm=norm)
    theirs, _ = optax.clip_by_global_norm(1.0).update(g, optax.EmptyState())
    for k in g:
        np.testing.assert_array_equal(ours[k], theirs[k])
    # The given norm is the one used (not computed again).
    for clip in (optimizers.optax_clip_by_global_norm, reference.torch_clip_by_global_norm):
        clipped, _ = clip(1.0).update(g, optax.EmptyState(), grad_norm=jnp.float32(100.0))
        np.testing.assert_allclose(clipped["a"], g["a"] / 100.0, rtol=1e-6)


def test_make_optimizer_chooses_by_train_optimizer():
    params, grads = problem()
    config = ml_collections.ConfigDict(dict(
        learning_rate=LR, head_learning_rate=0.0, adam_b1=B1, adam_b2=B2, adam_eps=EPS,
        weight_decay=0.0, grad_clip_norm=0.0, schedule="constant", warmup_fraction=0.1,
        freeze_encoder=False, optimizer="hf_adamw"))
    tx, _ = make_optimizer(config, total_steps=3)
    want = hand_hf_adamw(params, grads, weight_decay=0.0)
    got = run(tx, params, grads)
    np.testing.assert_allclose(got["w"] - params["w"], want["w"] - params["w"], rtol=2e-5,
                               atol=1e-9)
    config.optimizer = "adamw"
    tx, _ = make_optimizer(config, total_steps=3)
    ox = run(optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=0.0), params, grads)
    np.testing.assert_array_equal(run(tx, params, grads)["w"], ox["w"])
    # Without a clip the optimizer takes the step's norm too, and ignores it.
    state = tx.init(params)
    given, _ = tx.update(grads[0], state, params, grad_norm=jnp.float32(1e9))
    np.testing.assert_array_equal(given["w"], tx.update(grads[0], state, params)[0]["w"])
    # An unknown name is refused once, by the schema (the typed config make_optimizer reads).
    with pytest.raises(ConfigError, match="train.optimizer"):
        sections.TrainConfig(optimizer="sgd")
