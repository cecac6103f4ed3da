"""Layers under nn.scan (trip_jax/models/layer_stack.py): the stacked encoder equals its layers
applied one by one, each layer draws its own initialisation and dropout, remat and unroll
change nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import transformers

from trip_jax.models.families.bert import BertEmbeddings, BertEncoder, BertLayer
from trip_jax.models.segments import attention_bias

CONFIG = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3,
                                 num_attention_heads=2, intermediate_size=32,
                                 max_position_embeddings=16)
IDS = jnp.asarray(np.random.default_rng(0).integers(1, 40, (2, 6)), jnp.int32)
MASK = jnp.ones_like(IDS).at[1, 4:].set(0)


def init():
    return BertEncoder(CONFIG).init(jax.random.key(0), IDS, MASK)["params"]


def test_the_stack_equals_its_layers_one_by_one():
    params = init()
    hidden = BertEmbeddings(CONFIG).apply({"params": params["embeddings"]}, IDS,
                                          jnp.zeros_like(IDS), True)
    bias = attention_bias(MASK)
    for i in range(CONFIG.num_hidden_layers):
        layer = jax.tree.map(lambda p: p[i], params["encoder"]["layer"])
        hidden, _ = BertLayer(CONFIG).apply({"params": layer}, hidden, bias)
    np.testing.assert_allclose(BertEncoder(CONFIG).apply({"params": params}, IDS, MASK), hidden,
                               rtol=1e-6, atol=1e-6)


def test_each_layer_draws_its_own_initialisation_and_dropout():
    params = init()
    kernel = params["encoder"]["layer"]["attention"]["self"]["query"]["kernel"]
    assert kernel.shape == (3, 16, 16)
    assert not np.allclose(kernel[0], kernel[1]) and not np.allclose(kernel[1], kernel[2])
    # Dropout on: the same key gives the same output, another key another one.
    run = lambda seed: BertEncoder(CONFIG).apply({"params": params}, IDS, MASK,
                                                 deterministic=False,
                                                 rngs={"dropout": jax.random.key(seed)})
    np.testing.assert_array_equal(run(1), run(1))
    assert not np.allclose(run(1), run(2))


def test_remat_inside_the_scan_keeps_values_and_gradients():
    params = init()
    weights = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 16)), jnp.float32)

    def loss(p, remat):
        return jnp.sum(BertEncoder(CONFIG, remat=remat).apply({"params": p}, IDS, MASK) * weights)

    plain, grads = jax.value_and_grad(loss)(params, False)
    remat, remat_grads = jax.value_and_grad(loss)(params, True)
    np.testing.assert_allclose(remat, plain, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)  # gradients up to ~50


def test_unrolled_scan_keeps_parameters_dropout_values_and_gradients():
    params = init()
    unrolled_params = BertEncoder(CONFIG, unroll=True).init(jax.random.key(0), IDS, MASK)["params"]
    # The same draws; the arithmetic that shapes them may round apart by an ulp (XLA:CPU's older
    # fusion emitters, which the tests compile with: tests/conftest.py).
    for a, b in zip(jax.tree.leaves(unrolled_params), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    weights = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 16)), jnp.float32)

    def loss(p, unroll):
        out = BertEncoder(CONFIG, unroll=unroll).apply({"params": p}, IDS, MASK,
                                                       deterministic=False,
                                                       rngs={"dropout": jax.random.key(3)})
        return jnp.sum(out * weights)

    rolled, grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, False)
    unrolled, unrolled_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, True)
    np.testing.assert_allclose(unrolled, rolled, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(unrolled_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
