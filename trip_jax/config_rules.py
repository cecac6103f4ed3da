"""The allowed values of the numeric and string config keys, checked before any work starts.

``RANGES`` maps a dotted config key to its ``Rule`` (a test and a few words saying what is
allowed); ``CROSS_RULES`` are the rules between keys (a width divisible by a head count, a
length below another). ``check_config(config)`` applies both when the flags are parsed and
raises ``cli.UsageError`` with one line naming the key, its value and what is allowed:

    bad value for --config.train.batch_size: -3 (allowed: >= 1)

``check_devices(config, device_count)`` applies the rules that need the device count (the
mesh sizes and the batch split over them); ``trip_jax.main`` calls it once a multi-process run
is joined, before any data is read. Choice-valued keys are checked by
``cli.check_config_choices`` against the choice lists of the modules that use them
(``trip_jax.main.CONFIG_CHOICES``). docs/reference.md ("Allowed values") lists the rules.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from trip_jax import checkpoints, cli, sharding


@dataclasses.dataclass(frozen=True)
class Rule:
    """The allowed values of one key: ``test(value)`` is True for them; ``allowed`` says which."""

    test: Callable[[Any], bool]
    allowed: str


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def at_least(low: float) -> Rule:
    """Numbers >= ``low``."""
    return Rule(lambda v: _is_number(v) and v >= low, f">= {low}")


def above(low: float) -> Rule:
    """Numbers > ``low``."""
    return Rule(lambda v: _is_number(v) and v > low, f"> {low}")


def interval(text: str) -> Rule:
    """Numbers in an interval written as in mathematics: ``"[0, 1)"``, ``"(0, 1)"``, ..."""
    match = re.fullmatch(r"([\[(])\s*([^,]+),\s*([^\])]+)([\])])", text)
    if not match:
        raise ValueError(f"not an interval: {text!r}")
    opening, low, high, closing = match.groups()
    low, high = float(low), float(high)

    def test(value: Any) -> bool:
        if not _is_number(value):
            return False
        above_low = value >= low if opening == "[" else value > low
        below_high = value <= high if closing == "]" else value < high
        return above_low and below_high

    return Rule(test, f"in {text}")


def _is_regex(value: Any) -> bool:
    """A string that compiles as a Python regular expression."""
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


POSITIVE_INT = at_least(1)
NON_NEGATIVE = at_least(0)
DROPOUT = interval("[0, 1)")
# -1: every device the other mesh axis leaves (sharding.mesh_shape).
MESH_SIZE = Rule(lambda v: _is_number(v) and (v == -1 or v >= 1),
                 "-1 (every device the other axis leaves) or >= 1")
CHECKPOINT = Rule(lambda v: isinstance(v, str) and (v in checkpoints.KINDS or v.isdigit()),
                  f"{', '.join(checkpoints.KINDS)} or a step number")

# Dotted config key -> the values it allows (keys absent here take any value of their type).
RANGES: dict[str, Rule] = {
    "data.holdout_fraction": interval("(0, 1)"),
    "data.holdout_seed": NON_NEGATIVE,
    "data.max_pairs": NON_NEGATIVE,              # 0: all
    "data.max_sentences": POSITIVE_INT,
    "data.max_length": NON_NEGATIVE,             # 0: never cut
    "data.seq_len": NON_NEGATIVE,                # dense: 0, bucketed per batch
    "data.pack_length": POSITIVE_INT,
    "data.max_shapes": POSITIVE_INT,
    **{f"data.buckets.{key}": POSITIVE_INT for key in (
        "entity_min", "entity_step", "token_multiple")},
    **{f"model.random_encoder.{key}": POSITIVE_INT for key in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "max_position_embeddings")},
    **{f"model.tiered.{key}": DROPOUT for key in (
        "head_dropout", "projection_dropout", "detector_input_dropout", "detector_dropout",
        "conflict_dropout")},
    "model.tiered.embedding_projection": POSITIVE_INT,
    "model.tiered.state_projection": POSITIVE_INT,
    "model.tiered.detector_layers": NON_NEGATIVE,  # 0: projections straight to Dense(S)
    "model.tiered.detector_heads": POSITIVE_INT,
    "model.tiered.detector_ff": POSITIVE_INT,
    "model.tiered.detector_layer_norm_eps": above(0),
    "model.tiered.padding_row_length": POSITIVE_INT,
    **{f"loss.{key}": NON_NEGATIVE for key in (
        "pre_weight", "eff_weight", "conflict_weight", "story_weight")},
    "loss.conflict_positive_weight": above(0),
    "train.learning_rate": above(0),
    "train.head_learning_rate": NON_NEGATIVE,    # 0: learning_rate
    "train.adam_b1": interval("[0, 1)"),
    "train.adam_b2": interval("[0, 1)"),
    "train.adam_eps": above(0),
    "train.weight_decay": NON_NEGATIVE,
    "train.grad_clip_norm": NON_NEGATIVE,        # 0: no clipping
    "train.warmup_fraction": interval("[0, 1)"),
    "train.init_from_checkpoint": CHECKPOINT,
    "train.init_skip": Rule(_is_regex, "a Python regular expression ('': none)"),
    "train.batch_size": POSITIVE_INT,
    "train.eval_batch_size": POSITIVE_INT,
    "train.num_epochs": POSITIVE_INT,
    "train.seed": NON_NEGATIVE,
    "train.eval_every_steps": NON_NEGATIVE,      # 0: after each epoch only
    "train.log_every_steps": NON_NEGATIVE,       # 0: never
    "train.checkpoint_every_steps": NON_NEGATIVE,  # 0: after each epoch only
    "train.keep_checkpoints": POSITIVE_INT,
    "train.selection_window": POSITIVE_INT,
    "decoding.conflict_weight": NON_NEGATIVE,
    "decoding.state_threshold": interval("[0, 1)"),  # 0: every argmax
    "decoding.conflict_state_threshold": interval("[0, 1)"),  # 0: off
    "mesh.data": MESH_SIZE,
    "mesh.fsdp": MESH_SIZE,
    "mesh.fsdp_min_size": NON_NEGATIVE,
}

# A rule between keys: returns (the key to change, what it allows) when ``values`` (every key by
# dotted path, cli.config_values) breaks it, else None.
CrossRule = Callable[[Mapping[str, Any]], tuple[str, str] | None]


def _seq_len(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values.get("data.seq_len") and values.get("data.layout") == "packed_tokens":
        return "data.seq_len", "0 with data.layout 'packed_tokens' (it packs data.pack_length)"
    return None


def _detector_heads(values: Mapping[str, Any]) -> tuple[str, str] | None:
    width = (values.get("model.tiered.embedding_projection", 0)
             + values.get("model.tiered.state_projection", 0))
    heads = values.get("model.tiered.detector_heads")
    if heads and width % heads:
        return ("model.tiered.detector_heads", f"a divisor of the detector width {width} "
                "(embedding_projection + state_projection)")
    return None


def _random_encoder(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values.get("model.encoder", "x"):
        return None  # a pretrained encoder: random_encoder is not used
    if not values.get("model.tokenizer"):
        return ("model.tokenizer", "a tokenizer (e.g. 'word_level:bert') when model.encoder is "
                "empty (a random encoder)")
    width = values.get("model.random_encoder.hidden_size")
    heads = values.get("model.random_encoder.num_attention_heads")
    if width and heads and width % heads:
        return ("model.random_encoder.num_attention_heads",
                f"a divisor of model.random_encoder.hidden_size ({width})")
    return None


def _mesh_axes(values: Mapping[str, Any]) -> tuple[str, str] | None:
    if values.get("mesh.data") == -1 and values.get("mesh.fsdp") == -1:
        return "mesh.fsdp", "not -1 when mesh.data is -1 (one axis takes what the other leaves)"
    return None


CROSS_RULES: tuple[CrossRule, ...] = (
    _seq_len, _detector_heads, _random_encoder, _mesh_axes)


def bad_value(key: str, value: Any, allowed: str) -> str:
    """One line: ``bad value for --config.KEY: VALUE (allowed: ...)``."""
    return f"bad value for --config.{key}: {value!r} (allowed: {allowed})"


def check_config(config: ml_collections.ConfigDict) -> None:
    """``cli.UsageError`` for the first key of ``config`` outside ``RANGES`` or breaking a
    ``CROSS_RULES`` rule (keys the config lacks are skipped)."""
    values = cli.config_values(config)
    for key, rule in RANGES.items():
        if key in values and not rule.test(values[key]):
            raise cli.UsageError(bad_value(key, values[key], rule.allowed))
    for cross_rule in CROSS_RULES:
        broken = cross_rule(values)
        if broken is not None:
            key, allowed = broken
            raise cli.UsageError(bad_value(key, values[key], allowed))


def check_devices(config: ml_collections.ConfigDict, device_count: int) -> None:
    """``cli.UsageError`` when the mesh sizes do not fit ``device_count`` devices, or when
    ``train.batch_size`` does not split over them (every device gets its own pairs)."""
    try:
        data, fsdp = sharding.mesh_shape(config.mesh, device_count)
    except ValueError:
        raise cli.UsageError(
            f"bad value for --config.mesh.data, --config.mesh.fsdp: data={config.mesh.data}, "
            f"fsdp={config.mesh.fsdp} (allowed: sizes whose product is the {device_count} "
            f"device{'s' if device_count != 1 else ''}; one of them -1 takes what the other "
            "leaves)") from None
    shards = data * fsdp  # sharding.BATCH_AXES: the batch is split over both axes
    if config.train.batch_size % shards:
        raise cli.UsageError(bad_value(
            "train.batch_size", config.train.batch_size,
            f"a multiple of {shards}, the devices the batch is split over: mesh data={data} x "
            f"fsdp={fsdp}"))
