"""T5's encoder family beyond the checks every family gets (tests/test_families.py): its
buckets, its facts, its random encoder."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import encoder_parity as parity  # noqa: E402
from trip_jax import encoder_registry as registry  # noqa: E402
from trip_jax.models import relative_positions  # noqa: E402


def test_buckets_equal_hugging_faces():
    from transformers.models.t5.modeling_t5 import T5Attention
    for buckets, distance in ((32, 128), (8, 20), (64, 256)):
        ours = relative_positions.relative_position_buckets(300, buckets, distance)
        rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
        theirs = T5Attention._relative_position_bucket(rel, True, buckets, distance).numpy()
        np.testing.assert_array_equal(ours, theirs)


def test_the_family_declares_no_token_types_and_a_tokenizer_without_cls():
    family = registry.family_of("t5")
    assert not family.capabilities.token_types and not family.capabilities.mask_bias
    assert family.tokenizer.cls is None and "first token" in family.pooled


def test_the_random_encoder_is_flan_t5_like_at_the_configs_width():
    config = parity.tiny_config("t5")  # a tiny run's: tests/test_families.py
    assert config.d_ff == parity.TINY["intermediate_size"] and config.is_gated_act
