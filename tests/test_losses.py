"""Tests of the tiered loss on hand-built logits against plain numpy computations."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from trip_jax.data import schema
from trip_jax.training.losses import LOSS_PRESETS, LossConfig, loss_preset, tiered_loss
from trip_jax.models.tiered import NEG_LOGIT, class_mask

B, E, S = 2, 2, 3
NUM_CLASSES = np.asarray(schema.NUM_CLASSES)


def make_case(seed: int = 0):
    """Random outputs and a batch with padded rows inside real pairs (no padding pairs)."""
    rng = np.random.default_rng(seed)
    row_mask = np.ones((B, 2, E, S), bool)
    row_mask[0, 1, 1] = False          # a padding entity
    row_mask[1, :, :, 2] = False       # a padding sentence in both stories
    logits = rng.normal(size=(2, B, 2, E, S, 20, 9)).astype(np.float32)
    logits = np.where(class_mask(schema.NUM_CLASSES), logits, NEG_LOGIT).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=(2, B, 2, E, S, 20)).astype(np.int32)
    conflict_logits = rng.normal(size=(B, 2, E, S)).astype(np.float32)
    conflict_prob = (1 / (1 + np.exp(-conflict_logits))) * row_mask
    outputs = dict(pre_logits=logits[0], eff_logits=logits[1],
                   conflict_logits=conflict_logits, conflict_prob=conflict_prob,
                   story_logits=-conflict_prob.sum((2, 3)) / 2)
    batch = dict(row_mask=row_mask, pair_mask=np.ones(B, bool),
                 pre_label=labels[0] * row_mask[..., None],
                 eff_label=labels[1] * row_mask[..., None],
                 conflict_label=(rng.integers(0, 2, (B, 2, E, S)) * row_mask).astype(np.int32),
                 story_label=np.asarray([0, 1], np.int32))
    return outputs, batch


def hand_state_loss(logits, labels, rows):
    """Per-attribute n_a-class cross-entropy averaged over ``rows``, summed, divided by 20."""
    total = 0.0
    for a, n_a in enumerate(NUM_CLASSES):
        z = logits[rows][:, a, :n_a].astype(np.float64)
        log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
        total += -log_probs[np.arange(len(z)), labels[rows][:, a]].mean()
    return total / 20


def hand_components(outputs, batch, rows):
    """All four unweighted losses by plain numpy, averaging over the cells where ``rows``."""
    p = np.clip(np.asarray(outputs["conflict_prob"], np.float64), 1e-12, 1 - 1e-12)
    y = batch["conflict_label"]
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    bce[~batch["row_mask"]] = 0.0  # belief 0 and label 0: zero loss
    score = np.asarray(outputs["story_logits"], np.float64)
    log_probs = score - np.log(np.exp(score).sum(-1, keepdims=True))
    return dict(
        pre=hand_state_loss(outputs["pre_logits"], batch["pre_label"], rows),
        eff=hand_state_loss(outputs["eff_logits"], batch["eff_label"], rows),
        conflict=bce[rows].mean(),
        story=-log_probs[np.arange(B), batch["story_label"]].mean())


@pytest.mark.parametrize("mask_padding", [True, False])
def test_components_equal_hand_computation(mask_padding):
    outputs, batch = make_case()
    config = LossConfig(0.1, 0.2, 0.3, 0.4, mask_padding_in_losses=mask_padding)
    total, parts = tiered_loss(outputs, batch, config)
    rows = batch["row_mask"] if mask_padding else np.ones_like(batch["row_mask"])
    expected = hand_components(outputs, batch, rows)
    for key, value in expected.items():
        np.testing.assert_allclose(parts[key], value, rtol=1e-5, err_msg=key)
    weighted = 0.1 * expected["pre"] + 0.2 * expected["eff"] + 0.3 * expected["conflict"] \
        + 0.4 * expected["story"]
    np.testing.assert_allclose(total, weighted, rtol=1e-5)
    np.testing.assert_allclose(parts["total"], total)


def test_masking_switch_changes_the_state_loss():
    outputs, batch = make_case()
    masked = tiered_loss(outputs, batch, LossConfig(mask_padding_in_losses=True))[1]
    unmasked = tiered_loss(outputs, batch, LossConfig(mask_padding_in_losses=False))[1]
    assert abs(float(masked["pre"]) - float(unmasked["pre"])) > 1e-3
    # Padded rows add zero conflict loss but count in the reference's denominator.
    real, cells = batch["row_mask"].sum(), batch["row_mask"].size
    np.testing.assert_allclose(unmasked["conflict"], masked["conflict"] * real / cells, rtol=1e-5)


def test_padding_contents_and_padding_pairs_do_not_change_the_loss():
    outputs, batch = make_case()
    base = tiered_loss(outputs, batch, LossConfig(0.3, 0.3, 0.2, 0.2))[1]
    rng = np.random.default_rng(1)
    pad = ~batch["row_mask"]
    noisy = {k: np.array(v) for k, v in outputs.items()}
    for key in ("pre_logits", "eff_logits"):
        noisy[key][pad] += 50 * rng.normal(size=noisy[key][pad].shape).astype(np.float32)
    noisy["conflict_logits"][pad] = 30.0
    noisy_batch = dict(batch, pre_label=np.where(pad[..., None], 2, batch["pre_label"]))
    # Append an empty pair with arbitrary outputs.
    extra = {k: np.concatenate([v, 7 * np.ones_like(v[:1])]) for k, v in noisy.items()}
    extra_batch = {k: np.concatenate([v, np.zeros_like(v[:1])]) for k, v in noisy_batch.items()}
    extra_batch["story_label"][-1] = 1
    for out, bat in ((noisy, noisy_batch), (extra, extra_batch)):
        parts = tiered_loss(out, bat, LossConfig(0.3, 0.3, 0.2, 0.2))[1]
        for key in base:
            np.testing.assert_allclose(parts[key], base[key], rtol=1e-5, err_msg=key)


def test_gradients_on_padding_are_zero_and_loss_jits():
    outputs, batch = make_case()

    @jax.jit
    def loss(out):
        return tiered_loss(out, batch, LossConfig(0.3, 0.3, 0.2, 0.2))[0]

    np.testing.assert_allclose(loss(outputs), tiered_loss(outputs, batch,
                                                          LossConfig(0.3, 0.3, 0.2, 0.2))[0],
                               rtol=1e-6)
    grads = jax.grad(loss)(outputs)
    pad = ~batch["row_mask"]
    assert np.isfinite(np.asarray(grads["pre_logits"])).all()
    assert not np.asarray(grads["pre_logits"])[pad].any()
    assert not np.asarray(grads["conflict_logits"])[pad].any()
    invalid = ~class_mask(schema.NUM_CLASSES)
    assert not np.asarray(grads["pre_logits"])[..., invalid].any()
    assert np.asarray(grads["pre_logits"])[~pad].any()


def test_presets_match_table_2():
    assert loss_preset("omit_story") == LossConfig()  # the paper's best is the default
    assert (LossConfig().pre_weight, LossConfig().eff_weight, LossConfig().conflict_weight,
            LossConfig().story_weight) == (0.4, 0.4, 0.2, 0.0)
    assert set(LOSS_PRESETS) == {"all", "omit_story", "omit_conflict", "omit_states"}
    assert loss_preset("omit_conflict").conflict_weight == 0.0
    omit_states = loss_preset("omit_states", mask_padding_in_losses=False)
    assert (omit_states.pre_weight, omit_states.eff_weight) == (0.0, 0.0)
    assert not omit_states.mask_padding_in_losses
    for weights in LOSS_PRESETS.values():
        assert sum(weights) == pytest.approx(1.0)
    with pytest.raises(KeyError):
        loss_preset("best")
    with pytest.raises(KeyError):
        LossConfig.from_mapping({"story_weigth": 0.1})


def test_omitted_loss_contributes_nothing():
    outputs, batch = make_case()
    total, parts = tiered_loss(outputs, batch, loss_preset("omit_story"))
    assert float(parts["story"]) > 0
    np.testing.assert_allclose(
        total, 0.4 * parts["pre"] + 0.4 * parts["eff"] + 0.2 * parts["conflict"], rtol=1e-6)
