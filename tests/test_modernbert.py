"""The ModernBERT family: parity with Hugging Face's PyTorch ModernBertModel (with and without
biases; local and global layers), on single and packed rows, checkpoint loading, a tiny run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import encoder_parity as parity  # noqa: E402
from trip_jax import train  # noqa: E402
from trip_jax import encoder_registry as registry
from trip_jax.models import weights  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402
from trip_jax.models.families import modernbert  # noqa: E402

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")
REPO = Path(__file__).resolve().parents[1]
TOL = 1e-4
# Layers 0 and 2 global, 1 local with a window of 2 tokens each side: rows of 12 tokens see it.
TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, local_attention=4,
            global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=None, eos_token_id=None,
            cls_token_id=None, sep_token_id=None)
VARIANTS = {"plain": {}, "biased": dict(norm_bias=True, attention_bias=True, mlp_bias=True)}


def _torch_model(variant: str, model_cls=None):
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**TINY, **VARIANTS[variant])
    config._attn_implementation = "eager"
    model = (model_cls or transformers.ModernBertModel)(config).eval()
    # Norms start at (1, 0): perturb everything so each tensor matters.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """variant -> (torch model, safetensors directory, pytorch_model.bin directory)."""
    out = {}
    for variant in VARIANTS:
        model = _torch_model(variant)
        st_dir = tmp_path_factory.mktemp(f"modernbert_{variant}_st")
        model.save_pretrained(st_dir)
        bin_dir = tmp_path_factory.mktemp(f"modernbert_{variant}_bin")
        model.config.save_pretrained(bin_dir)
        torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
        out[variant] = (model, st_dir, bin_dir)
    return out


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_single_rows_match_torch_and_load_with_an_empty_report(tiny, variant, fmt):
    model, st_dir, bin_dir = tiny[variant]
    directory = st_dir if fmt == "safetensors" else bin_dir
    config, params = weights.load_pretrained(directory)
    assert config.model_type == "modernbert" and config.norm_bias == (variant == "biased")
    checkpoint, source = weights.read_checkpoint(directory)
    _, report = weights.convert_checkpoint(modernbert.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and not report.unused
    assert "model/layers/2/attn/Wqkv/kernel" in report.loaded
    parity.assert_padded_rows_match(model, config, params, TINY["vocab_size"], TOL)


def test_packed_rows_match_each_row_alone_in_torch(tiny):
    model, st_dir, _ = tiny["biased"]
    config, params = weights.load_pretrained(st_dir)
    parity.assert_packed_rows_match(model, config, params, TINY["vocab_size"], TOL)


def test_a_masked_lm_checkpoint_loads_its_encoder_and_reports_the_head(tmp_path):
    model = _torch_model("plain", transformers.ModernBertForMaskedLM)
    model.save_pretrained(tmp_path)
    config, params = weights.load_pretrained(tmp_path)
    checkpoint, source = weights.read_checkpoint(tmp_path)
    _, report = weights.convert_checkpoint(modernbert.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and report.unused
    assert all(name.startswith(("head.", "decoder.")) for name in report.unused), report.unused
    ids = np.asarray(parity.random_rows([10], TINY["vocab_size"])[0])[None]
    ours = jax.jit(build_encoder(config).apply)({"params": params}, ids, np.ones_like(ids))
    with torch.no_grad():
        theirs = model.model(input_ids=torch.tensor(ids, dtype=torch.long)
                             ).last_hidden_state.numpy()
    assert np.abs(np.asarray(ours) - theirs).max() <= TOL


def test_the_family_declares_no_token_types_and_its_own_special_tokens():
    family = registry.family_of("modernbert")
    assert not family.capabilities.token_types and not family.capabilities.mask_bias
    assert family.tokenizer.cls == "[CLS]" and not family.tokenizer.token_types
    assert list(family.tokenizer.special_tokens)[:4] == ["unk_token", "cls_token", "sep_token",
                                                         "pad_token"]  # ModernBERT's id order
    config = transformers.ModernBertConfig(**TINY)
    module = build_encoder(config)
    ids = jnp.asarray(parity.random_rows([6], TINY["vocab_size"])[0])[None]
    params = module.init(jax.random.key(0), ids, jnp.ones_like(ids))
    types = jnp.ones_like(ids)
    np.testing.assert_array_equal(module.apply(params, ids, jnp.ones_like(ids), types),
                                  module.apply(params, ids, jnp.ones_like(ids)))


def test_the_tiered_model_trains_end_to_end_at_tiny_size(tiny_config, tmp_path):
    config = tiny_config()
    config.train.num_epochs = 1
    config.data.protocol = "dev_all"  # no selection split: one eval step to compile, not two
    config.model.random_encoder.model_type = "modernbert"
    config.model.tokenizer = "word_level:modernbert"
    train.train_and_evaluate(config, str(tmp_path))
    saved = json.loads((tmp_path / "encoder_config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["intermediate_size"] == 64
    assert saved["layer_types"] == ["full_attention", "sliding_attention"]
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["split"] == "train"]
    assert [r["step"] for r in steps] == [2, 4]
    assert all(np.isfinite(r["loss/total"]) and r["grad_norm"] > 0 for r in steps)


def test_configs_modernbert_names_the_large_model_and_stops_in_one_line_when_not_cached(
        tmp_path, data_dir, main_install):
    from configs import modernbert as modernbert_config
    assert modernbert_config.get_config().model.encoder == "answerdotai/ModernBERT-large"
    env = main_install({**os.environ, "HF_HOME": str(tmp_path / "hf_empty"),
                        "TRIP_DATA_DIR": data_dir, "PYTHONPATH": str(REPO)})
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-m", "trip_jax.main",
                             "--config=configs/modernbert.py", f"--workdir={tmp_path / 'w'}"],
                            cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and "could not load 'answerdotai/ModernBERT-large'" in errors[0]
    assert "Traceback" not in result.stderr
