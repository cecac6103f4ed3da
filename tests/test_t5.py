"""T5's encoder family beyond the checks every family gets (tests/test_families.py): its
buckets, a seq2seq checkpoint's encoder, its facts, a tiny training run, its config."""

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


def test_buckets_equal_hugging_faces():
    from transformers.models.t5.modeling_t5 import T5Attention
    for buckets, distance in ((32, 128), (8, 20), (64, 256)):
        ours = relative_positions.relative_position_buckets(300, buckets, distance)
        rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
        theirs = T5Attention._relative_position_bucket(rel, True, buckets, distance).numpy()
        np.testing.assert_array_equal(ours, theirs)


def test_a_seq2seq_checkpoint_loads_its_encoder_and_reports_the_decoder(tmp_path):
    model = parity.tiny_torch_model("t5", transformers.T5ForConditionalGeneration)
    model.save_pretrained(tmp_path)
    config, params = weights.load_pretrained(tmp_path)
    checkpoint, source = weights.read_checkpoint(tmp_path)
    _, report = weights.convert_checkpoint(t5.convert(checkpoint),
                                           weights.expected_params(config), source=source)
    assert not report.missing and report.unused
    assert all(name.startswith(("decoder.", "lm_head.")) for name in report.unused)
    ids = np.asarray(parity.random_rows([10], config.vocab_size)[0])[None]
    ours = jax.jit(build_encoder(config).apply)({"params": params}, ids, np.ones_like(ids))
    with torch.no_grad():
        theirs = model.encoder(input_ids=torch.tensor(ids, dtype=torch.long)
                               ).last_hidden_state.numpy()
    assert np.abs(np.asarray(ours) - theirs).max() <= TOL


def test_the_family_declares_no_token_types_and_a_tokenizer_without_cls():
    family = registry.family_of("t5")
    assert not family.capabilities.token_types and not family.capabilities.mask_bias
    assert family.tokenizer.cls is None and "first token" in family.pooled


def test_the_random_encoder_is_flan_t5_like_at_the_configs_width():
    config = parity.tiny_config("t5")  # a tiny run's: tests/test_families.py
    assert config.d_ff == parity.TINY["intermediate_size"] and config.is_gated_act


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
