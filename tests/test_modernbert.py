"""The ModernBERT family beyond the checks every family gets (tests/test_families.py): its
tokenizer's facts, its random encoder."""

import pytest

transformers = pytest.importorskip("transformers")

import encoder_parity as parity  # noqa: E402
from trip_jax import encoder_registry as registry  # noqa: E402


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
