"""The ModernBERT family beyond the checks every family gets (tests/test_families.py): a masked-LM
checkpoint's encoder, its tokenizer's facts, a tiny training run, its config."""

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


def test_a_masked_lm_checkpoint_loads_its_encoder_and_reports_the_head(tmp_path):
    model = parity.tiny_torch_model("modernbert", transformers.ModernBertForMaskedLM)
    model.save_pretrained(tmp_path)
    config, params = weights.load_pretrained(tmp_path)
    checkpoint, source = weights.read_checkpoint(tmp_path)
    _, report = weights.convert_checkpoint(modernbert.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and report.unused
    assert all(name.startswith(("head.", "decoder.")) for name in report.unused), report.unused
    ids = np.asarray(parity.random_rows([10], config.vocab_size)[0])[None]
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


def test_the_random_encoder_has_a_global_then_a_local_layer():
    config = parity.tiny_config("modernbert")  # a tiny run's: tests/test_families.py
    assert config.intermediate_size == parity.TINY["intermediate_size"]
    assert config.layer_types == ["full_attention", "sliding_attention"]


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
