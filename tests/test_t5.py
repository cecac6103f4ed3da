"""T5's encoder family: parity with Hugging Face's PyTorch T5EncoderModel (v1.0 ReLU and
v1.1 / Flan gated GELU), on single and packed rows, checkpoint loading, and a tiny training run."""

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
from trip_jax.models import relative_positions, weights  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402
from trip_jax.models.families import t5  # noqa: E402

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")
REPO = Path(__file__).resolve().parents[1]
TOL = 1e-4
# 8 buckets over distances up to 20: rows of 12 tokens reach the logarithmic buckets.
TINY = dict(vocab_size=100, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=20,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
VARIANTS = {"v1.1": dict(feed_forward_proj="gated-gelu"), "v1.0": dict(feed_forward_proj="relu")}


def _torch_model(variant: str, model_cls=None):
    torch.manual_seed(0)
    config = transformers.T5Config(**TINY, **VARIANTS[variant])
    config._attn_implementation = "eager"
    model = (model_cls or transformers.T5EncoderModel)(config).eval()
    # Norms start at 1: perturb everything so each tensor matters.
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
        st_dir = tmp_path_factory.mktemp(f"t5_{variant}_st")
        model.save_pretrained(st_dir)
        bin_dir = tmp_path_factory.mktemp(f"t5_{variant}_bin")
        model.config.save_pretrained(bin_dir)
        torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
        out[variant] = (model, st_dir, bin_dir)
    return out


def test_buckets_equal_hugging_faces():
    from transformers.models.t5.modeling_t5 import T5Attention
    for buckets, distance in ((32, 128), (8, 20), (64, 256)):
        ours = relative_positions.relative_position_buckets(300, buckets, distance)
        rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
        theirs = T5Attention._relative_position_bucket(rel, True, buckets, distance).numpy()
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_single_rows_match_torch_and_load_with_an_empty_report(tiny, variant, fmt):
    model, st_dir, bin_dir = tiny[variant]
    directory = st_dir if fmt == "safetensors" else bin_dir
    config, params = weights.load_pretrained(directory)
    assert config.model_type == "t5" and config.is_gated_act == (variant == "v1.1")
    checkpoint, source = weights.read_checkpoint(directory)
    _, report = weights.convert_checkpoint(t5.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and not report.unused
    assert "encoder/relative_attention_bias/embedding" in report.loaded
    parity.assert_padded_rows_match(model, config, params, TINY["vocab_size"], TOL)


def test_packed_rows_match_each_row_alone_in_torch(tiny):
    model, st_dir, _ = tiny["v1.1"]
    config, params = weights.load_pretrained(st_dir)
    parity.assert_packed_rows_match(model, config, params, TINY["vocab_size"], TOL)


def test_a_seq2seq_checkpoint_loads_its_encoder_and_reports_the_decoder(tmp_path):
    model = _torch_model("v1.1", transformers.T5ForConditionalGeneration)
    model.save_pretrained(tmp_path)
    config, params = weights.load_pretrained(tmp_path)
    checkpoint, source = weights.read_checkpoint(tmp_path)
    _, report = weights.convert_checkpoint(t5.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and report.unused
    assert all(name.startswith(("decoder.", "lm_head.")) for name in report.unused)
    ids = np.asarray(parity.random_rows([10], TINY["vocab_size"])[0])[None]
    ours = jax.jit(build_encoder(config).apply)({"params": params}, ids, np.ones_like(ids))
    with torch.no_grad():
        theirs = model.encoder(input_ids=torch.tensor(ids, dtype=torch.long)
                               ).last_hidden_state.numpy()
    assert np.abs(np.asarray(ours) - theirs).max() <= TOL


def test_the_family_declares_no_token_types_and_a_tokenizer_without_cls():
    family = registry.family_of("t5")
    assert not family.capabilities.token_types and not family.capabilities.mask_bias
    assert family.tokenizer.cls is None and "first token" in family.pooled
    config = transformers.T5Config(**TINY)
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
    config.model.random_encoder.model_type = "t5"
    config.model.tokenizer = "word_level:t5"
    train.train_and_evaluate(config, str(tmp_path))
    saved = json.loads((tmp_path / "encoder_config.json").read_text())
    assert saved["model_type"] == "t5" and saved["d_ff"] == 64 and saved["is_gated_act"]
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["split"] == "train"]
    assert [r["step"] for r in steps] == [2, 4]
    assert all(np.isfinite(r["loss/total"]) and r["grad_norm"] > 0 for r in steps)


def test_configs_t5_names_flan_t5_large_and_stops_in_one_line_when_not_cached(
        tmp_path, data_dir, main_install):
    from configs import t5 as t5_config
    assert t5_config.get_config().model.encoder == "google/flan-t5-large"
    env = main_install({**os.environ, "HF_HOME": str(tmp_path / "hf_empty"),
                        "TRIP_DATA_DIR": data_dir, "PYTHONPATH": str(REPO)})
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-m", "trip_jax.main", "--config=configs/t5.py",
                             f"--workdir={tmp_path / 'w'}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and "could not load 'google/flan-t5-large'" in errors[0]
    assert "Traceback" not in result.stderr
