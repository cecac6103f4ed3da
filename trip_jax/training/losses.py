"""The tiered training loss L = λp·Lp + λf·Lf + λc·Lc + λs·Ls.

Padding pairs never count; padded cells of real pairs count only with
``mask_padding_in_losses`` off, as the reference counted them.
Details: docs/reference.md#losses, docs/fidelity.md.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax

from trip_jax.config.sections import LOSS_PRESETS, LossConfig  # LOSS_PRESETS: the Table 2 rows


def loss_preset(name: str, *, mask_padding_in_losses: bool = True) -> LossConfig:
    """Returns the LossConfig of a Table 2 row: "all", "omit_story" (the paper's best),
    "omit_conflict" or "omit_states"."""
    if name not in LOSS_PRESETS:
        raise KeyError(f"unknown loss preset {name!r}; expected one of {sorted(LOSS_PRESETS)}")
    pre, eff, conflict, story = LOSS_PRESETS[name]
    return LossConfig(pre, eff, conflict, story, mask_padding_in_losses)


def _masked_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """Sum of values·weights over the sum of weights (0 when nothing counts)."""
    weights = weights.astype(jnp.float32)
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def _state_loss(logits: jax.Array, labels: jax.Array, rows: jax.Array) -> jax.Array:
    """Mean over counted rows of the per-attribute CE, averaged over attributes.

    logits [..., A, C], labels int [..., A], rows float [...] (1 = row counts). Every attribute
    averages over the same rows, so the attribute average equals one mean over (row, attribute).
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels.astype(jnp.int32))
    return _masked_mean(ce, jnp.broadcast_to(rows[..., None], ce.shape))


def tiered_loss(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array],
                config: LossConfig = LossConfig()) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Returns (total loss, components) for TieredModel outputs on a Batch-contract batch.

    ``components`` has float32 scalars "pre", "eff", "conflict", "story" (unweighted, always
    computed, for logging) and "total".
    """
    row_mask = jnp.asarray(batch["row_mask"], bool)
    pair_mask = jnp.asarray(batch["pair_mask"], bool)
    real_rows = row_mask & pair_mask[:, None, None, None]
    counted_rows = real_rows if config.mask_padding_in_losses else jnp.broadcast_to(
        pair_mask[:, None, None, None], row_mask.shape)

    pre = _state_loss(outputs["pre_logits"], batch["pre_label"], counted_rows)
    eff = _state_loss(outputs["eff_logits"], batch["eff_label"], counted_rows)

    conflict_label = batch["conflict_label"].astype(jnp.float32)
    bce = optax.sigmoid_binary_cross_entropy(
        outputs["conflict_logits"].astype(jnp.float32), conflict_label)
    # Padded rows have belief 0 and label 0: their BCE is 0 whether or not they are counted.
    bce = jnp.where(real_rows, bce, 0.0)
    conflict = _masked_mean(bce, counted_rows)

    story_ce = optax.softmax_cross_entropy_with_integer_labels(
        outputs["story_logits"].astype(jnp.float32), batch["story_label"].astype(jnp.int32))
    story = _masked_mean(story_ce, pair_mask)

    total = (config.pre_weight * pre + config.eff_weight * eff
             + config.conflict_weight * conflict + config.story_weight * story)
    return total, {"pre": pre, "eff": eff, "conflict": conflict, "story": story, "total": total}
