"""The checkpoint loader's renaming rules and its refusals of bad inputs (no torch needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file
from transformers import BertConfig

from trip_jax.models import weights

TINY = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=20)


def _torch_style_state(config, seed=0, layers=None) -> dict[str, np.ndarray]:
    """A random checkpoint with the PyTorch BertModel key names and shapes ([out, in] Linear)."""
    rs = np.random.RandomState(seed)
    h, i = config.hidden_size, config.intermediate_size
    state = {
        "embeddings.word_embeddings.weight": (config.vocab_size, h),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, h),
        "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
        "pooler.dense.weight": (h, h), "pooler.dense.bias": (h,),
    }
    for n in range(config.num_hidden_layers if layers is None else layers):
        p = f"encoder.layer.{n}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            state[p + name + ".weight"], state[p + name + ".bias"] = (h, h), (h,)
        state[p + "intermediate.dense.weight"], state[p + "intermediate.dense.bias"] = (i, h), (i,)
        state[p + "output.dense.weight"], state[p + "output.dense.bias"] = (h, i), (h,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            state[p + ln + ".weight"], state[p + ln + ".bias"] = (h,), (h,)
    return {k: rs.randn(*shape).astype(np.float32) for k, shape in state.items()}


def _write(directory: Path, config, state) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    save_file(state, str(directory / "model.safetensors"))
    return directory


@pytest.fixture()
def config():
    return BertConfig(**TINY)


def test_renaming_transposes_linear_and_strips_prefix(config, tmp_path):
    state = _torch_style_state(config)
    prefixed = {"bert." + k: v for k, v in state.items()}
    prefixed["cls.predictions.bias"] = np.zeros(50, np.float32)
    prefixed["bert.embeddings.position_ids"] = np.arange(20, dtype=np.int64)[None]
    _, params = weights.load_pretrained(_write(tmp_path, config, prefixed))
    q = params["encoder"]["layer"]["attention"]["self"]["query"]  # layers stacked: layer 1 = [1]
    np.testing.assert_array_equal(q["kernel"][1],
                                  state["encoder.layer.1.attention.self.query.weight"].T)
    np.testing.assert_array_equal(
        params["embeddings"]["LayerNorm"]["scale"], state["embeddings.LayerNorm.weight"])
    np.testing.assert_array_equal(
        params["embeddings"]["word_embeddings"]["embedding"],
        state["embeddings.word_embeddings.weight"])


def test_legacy_gamma_beta_names(config):
    state = _torch_style_state(config)
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}
    expected = weights.expected_params(config)
    flat, report = weights.convert_checkpoint({tuple(k.split(".")): v for k, v in legacy.items()}, expected)
    assert not report.missing
    np.testing.assert_array_equal(flat[("encoder", "layer", "0", "output", "LayerNorm", "bias")],
                                  state["encoder.layer.0.output.LayerNorm.bias"])
    assert report.unused == ("pooler.dense.bias", "pooler.dense.weight")


def test_dtype_cast(config, tmp_path):
    _, params = weights.load_pretrained(_write(tmp_path, config, _torch_style_state(config)),
                                        dtype=jnp.bfloat16)
    assert params["encoder"]["layer"]["output"]["dense"]["kernel"].dtype == jnp.bfloat16


def test_wrong_shape_names_key_and_file(config, tmp_path):
    directory = _write(tmp_path, config, _torch_style_state(config))
    config.intermediate_size = 24
    config.save_pretrained(directory)
    with pytest.raises(ValueError, match="shape mismatch") as err:
        weights.load_pretrained(directory)
    assert ("encoder.layer.0.intermediate.dense.weight as encoder/layer/0/intermediate/dense/"
            "kernel: has (16, 32), expects (16, 24)") in str(err.value)
    assert "model.safetensors" in str(err.value)


def test_missing_key_strict_and_lenient(config, tmp_path, caplog):
    state = _torch_style_state(config)
    del state["encoder.layer.1.output.dense.bias"]
    directory = _write(tmp_path, config, state)
    with pytest.raises(ValueError, match="missing parameters.*encoder/layer/1/output/dense/bias"):
        weights.load_pretrained(directory)
    with caplog.at_level("WARNING", logger="trip_jax.models.weights"):
        _, params = weights.load_pretrained(directory, strict=False)
    assert "encoder/layer/1/output/dense/bias" in caplog.text
    assert params["encoder"]["layer"]["output"]["dense"]["bias"].shape == (2, 16)


def test_extra_layer_is_an_architecture_mismatch(config, tmp_path):
    directory = _write(tmp_path, config, _torch_style_state(config, layers=3))
    with pytest.raises(ValueError, match="architecture mismatch.*encoder.layer.2"):
        weights.load_pretrained(directory)


def test_foreign_checkpoint_is_an_architecture_mismatch(config, tmp_path):
    state = {"transformer.h.0.attn.c_attn.weight": np.zeros((16, 48), np.float32)}
    with pytest.raises(ValueError, match="architecture mismatch.*transformer.h.0.attn.c_attn.weight"):
        weights.load_pretrained(_write(tmp_path, config, state))


def test_unknown_architecture_names_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ValueError, match="unknown architecture model_type='gpt2'") as err:
        weights.load_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)


def test_duplicate_tensors_for_one_parameter(config):
    state = _torch_style_state(config)
    checkpoint = {tuple(k.split(".")): v for k, v in state.items()}
    checkpoint[("embeddings", "LayerNorm", "gamma")] = state["embeddings.LayerNorm.weight"]
    with pytest.raises(ValueError, match="both map to parameter embeddings/LayerNorm/scale"):
        weights.convert_checkpoint(checkpoint, weights.expected_params(config))


def test_conversion_hook_runs_before_renaming(config, tmp_path, monkeypatch):
    state = _torch_style_state(config)
    odd = {k.replace("embeddings.", "emb.", 1): v for k, v in state.items()}
    directory = _write(tmp_path, config, odd)
    import dataclasses
    from trip_jax import encoder_registry as registry
    from trip_jax.models.families import bert
    monkeypatch.setattr(bert, "FAMILY", dataclasses.replace(bert.FAMILY, convert=lambda ckpt: {
        (("embeddings",) + k[1:] if k[0] == "emb" else k): v for k, v in ckpt.items()}))
    registry.families.cache_clear()
    try:
        _, params = weights.load_pretrained(directory)
    finally:
        monkeypatch.undo()
        registry.families.cache_clear()
    np.testing.assert_array_equal(params["embeddings"]["LayerNorm"]["bias"],
                                  state["embeddings.LayerNorm.bias"])


def test_missing_directory_names_path(tmp_path):
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        weights.load_pretrained(missing)


def test_directory_without_config_or_weights(config, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        weights.load_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"no weights in {tmp_path}"):
        weights.load_pretrained(tmp_path)


def test_offline_hub_name_says_how_to_provide_weights(tmp_path, monkeypatch):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as err:
        weights.load_pretrained("someone/roberta-large-copy", cache_dir=tmp_path)
    message = str(err.value)
    assert "'someone/roberta-large-copy'" in message and "\n" not in message
    assert "hf download someone/roberta-large-copy" in message
    assert "--config.model.encoder=DIR" in message


def test_safetensors_load_needs_no_torch(config, tmp_path):
    directory = _write(tmp_path, config, _torch_style_state(config))
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trip_jax.models.weights import load_pretrained\n"
            f"c, p = load_pretrained({str(directory)!r})\n"
            "print(p['encoder']['layer']['output']['dense']['kernel'][1].shape)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(32, 16)" in out.stdout
