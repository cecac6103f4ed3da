"""DeBERTa v1 / v2 / v3 in Flax against Hugging Face's PyTorch models (tiny random configs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.deberta_v2 import modeling_deberta_v2  # noqa: E402

from trip_jax.models.families.deberta import DebertaEncoder, make_log_bucket_position  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402
from trip_jax.models.weights import load_pretrained  # noqa: E402

# Parity at full float32 on any device (conftest).
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")
TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, layer_norm_eps=1e-7)

V1_CONFIGS = {
    # microsoft/deberta-base's switches: no absolute positions, no token types.
    "v1-base-like": dict(relative_attention=True, pos_att_type="c2p|p2c",
                         position_biased_input=False, type_vocab_size=0),
    # Span clamped below the sequence length, absolute positions, token types, embed_proj.
    "v1-clamped": dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=6,
                       position_biased_input=True, type_vocab_size=2, embedding_size=24),
    "v1-c2p-only": dict(relative_attention=True, pos_att_type="c2p", max_relative_positions=8,
                        type_vocab_size=0, hidden_act="gelu_new"),
    "v1-absolute-only": dict(relative_attention=False, position_biased_input=True,
                             type_vocab_size=2),
}
V2_CONFIGS = {
    # microsoft/deberta-v3-base's switches (with 8 buckets so log-bucketing shows at T=20).
    "v3-like": dict(relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8,
                    share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                    type_vocab_size=0),
    # deberta-v2-xlarge's conv layer, with separate position projections and linear distances.
    "v2-conv": dict(relative_attention=True, pos_att_type="p2c|c2p", max_relative_positions=6,
                    share_att_key=False, conv_kernel_size=3, conv_groups=2, conv_act="gelu",
                    position_biased_input=True, type_vocab_size=2, attention_head_size=8),
    "v2-buckets-c2p-conv": dict(relative_attention=True, pos_att_type="c2p", position_buckets=8,
                                max_relative_positions=32, share_att_key=False,
                                norm_rel_ebd="layer_norm", conv_kernel_size=5,
                                type_vocab_size=0),
}


def _hf_config(name: str):
    if name in V1_CONFIGS:
        return transformers.DebertaConfig(**TINY, **V1_CONFIGS[name])
    return transformers.DebertaV2Config(**TINY, **V2_CONFIGS[name])


def _torch_model(config, seed: int = 0):
    """HF masked-LM model (its checkpoint has the ``deberta.`` prefix and a head) with every
    parameter randomised, biases too, so that their wiring is tested."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForMaskedLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = 0.2 * torch.randn_like(param)
            param.copy_(1.0 + noise if "LayerNorm.weight" in name else noise)
    return model


def _inputs(config, seed: int = 1):
    """Three rows of 20 tokens: full, half padded, and a dense-layout padding row (1 token)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, config.vocab_size, size=(3, 20))
    mask = np.zeros((3, 20), np.int64)
    for row, length in enumerate((20, 12, 1)):
        mask[row, :length] = 1
    ids = np.where(mask == 1, ids, 0)
    types = rng.integers(0, max(config.type_vocab_size, 1), size=(3, 20)) * mask
    return ids, mask, types


@pytest.mark.parametrize("name", [*V1_CONFIGS, *V2_CONFIGS])
def test_last_hidden_state_matches_torch(name, tmp_path):
    torch_model = _torch_model(_hf_config(name))
    ids, mask, types = _inputs(torch_model.config)
    with torch.no_grad():
        expected = torch_model.base_model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            token_type_ids=torch.from_numpy(types)).last_hidden_state.numpy()
    torch_model.save_pretrained(tmp_path)

    config, params = load_pretrained(tmp_path)
    module = build_encoder(config)
    assert isinstance(module, DebertaEncoder)
    got = np.asarray(module.apply({"params": params}, jnp.asarray(ids, jnp.int32),
                                  jnp.asarray(mask, jnp.int32), jnp.asarray(types, jnp.int32)))
    assert got.shape == expected.shape == (3, 20, 32)
    assert np.abs(got - expected).max() <= 1e-4


@pytest.mark.parametrize("bucket_size,max_position", [(256, 512), (8, 64), (16, 100)])
def test_log_buckets_match_torch(bucket_size, max_position):
    rel = np.arange(-700, 701)
    expected = modeling_deberta_v2.make_log_bucket_position(
        torch.from_numpy(rel), bucket_size, max_position).long().numpy()
    np.testing.assert_array_equal(make_log_bucket_position(rel, bucket_size, max_position),
                                  expected)


def _random_params(module, ids, mask, types, seed: int = 0):
    """Random float32 parameters for ``module`` without compiling its init."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(module.init, jax.random.key(0), ids, mask, types)["params"]
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, 0.2, x.shape), x.dtype), shapes)


def _dropout_setup():
    config = _hf_config("v3-like")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
    ids, mask, types = _inputs(config)
    module = DebertaEncoder(config)
    params = _random_params(module, ids, mask, types)
    return module, params, (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))


def test_dropout_follows_rng_and_deterministic_flag():
    module, params, args = _dropout_setup()

    @jax.jit
    def forward(key):
        return module.apply({"params": params}, *args, deterministic=False,
                            rngs={"dropout": key})

    def run(deterministic, seed=0):
        if deterministic:
            return np.asarray(module.apply({"params": params}, *args, deterministic=True,
                                           rngs={"dropout": jax.random.key(seed)}))
        return np.asarray(forward(jax.random.key(seed)))

    eval_out = run(True)
    np.testing.assert_array_equal(eval_out, run(True, seed=5))
    train_a = run(False, seed=1)
    np.testing.assert_array_equal(train_a, run(False, seed=1))
    assert np.abs(train_a - run(False, seed=2)).max() > 1e-3
    assert np.abs(train_a - eval_out).max() > 1e-3


def test_remat_and_bfloat16_keep_the_function():
    config = _hf_config("v1-clamped")
    config.num_hidden_layers = 1  # compile time grows with depth; one layer shows the wiring
    ids, mask, types = (jnp.asarray(a, jnp.int32) for a in _inputs(config))
    plain = DebertaEncoder(config)
    params = _random_params(plain, ids, mask, types)

    def value_and_grad(module):
        def loss(p):
            return jnp.sum(module.apply({"params": p}, ids, mask, types) ** 2)
        return jax.jit(jax.value_and_grad(loss))(params)

    value, grads = value_and_grad(plain)
    remat_value, remat_grads = value_and_grad(DebertaEncoder(config, remat=True))
    np.testing.assert_allclose(remat_value, value, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads)):
        # Float32 noise relative to the leaf's scale (XLA fuses the two programs differently).
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max())

    half = DebertaEncoder(config, dtype=jnp.bfloat16)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(
        jax.eval_shape(half.init, jax.random.key(0), ids, mask, types)["params"]))
    out16 = jax.jit(half.apply)({"params": params}, ids, mask, types)
    out32 = plain.apply({"params": params}, ids, mask, types)
    assert out16.dtype == jnp.bfloat16
    assert np.abs(np.asarray(out16, np.float32) - np.asarray(out32)).max() < 0.1


def test_released_checkpoints_extra_position_embeddings_are_ignored(tmp_path):
    """microsoft/deberta-base ships position_embeddings although position_biased_input is false;
    like Hugging Face, the strict loader counts them unused instead of refusing the checkpoint."""
    from safetensors.numpy import load_file, save_file

    torch_model = _torch_model(_hf_config("v1-base-like"))
    torch_model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    assert not any("position_embeddings" in k for k in tensors)
    tensors["deberta.embeddings.position_embeddings.weight"] = np.ones((64, 32), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})

    ids, mask, types = _inputs(torch_model.config)
    with torch.no_grad():
        expected = torch_model.base_model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
        ).last_hidden_state.numpy()
    config, params = load_pretrained(tmp_path, strict=True)
    got = np.asarray(build_encoder(config).apply(
        {"params": params}, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
    assert np.abs(got - expected).max() <= 1e-4
