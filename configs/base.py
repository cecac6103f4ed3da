"""The base config: every key at its schema default, plus a mode, a model preset and a loss preset.

Not run directly: the other configs call ``get_config()``. The config argument names at most one
mode (``exact``/``clean``), model preset (``PRESETS``) and loss preset: ``roberta.py:clean,all``.
Keys are declared in ``trip_jax/config/sections.py``. Details: README.md#training.
"""

import ml_collections

from trip_jax.config.messages import unknown_choice
from trip_jax.config import fields, sections
from trip_jax.training.losses import LOSS_PRESETS

DEFAULT_LOSS_PRESET = "omit_story"

# The keys in which the original implementation's step differs from the cleaned-up variant,
# with each mode's values (docs/exact-mode.md: what each one does and its measured effect).
REFERENCE_MODES: dict[str, dict[str, object]] = {
    "exact": {
        "model.tiered.padding_rows": "encoded",
        "model.tiered.detector_padding_mask": False,
        "loss.mask_padding_in_losses": False,
        "data.entity_padding": "data_max",
        "data.token_types": "zeros",
        "train.optimizer": "hf_adamw",
        "data.max_length": 16,
        "model.tiered.cells": "grid",
        "data.dedup_rows": False,
        "model.matmul_precision": "highest",
    },
    "clean": {
        "model.tiered.padding_rows": "zero",
        "model.tiered.detector_padding_mask": True,
        "loss.mask_padding_in_losses": True,
        "data.entity_padding": "bucket",
        "data.token_types": "segments",
        "train.optimizer": "adamw",
        "data.max_length": 0,
        "model.tiered.cells": "real",
        "data.dedup_rows": True,
        "model.matmul_precision": "default",
    },
}


# The improvements over the paper's model, one switch for any encoder
# (``--config=configs/roberta.py:coherent``); "reference" sets nothing. docs/results.md gives
# each key's measured effect (the ablation table).
PRESETS: dict[str, dict[str, object]] = {
    "reference": {},
    "coherent": {
        # Story, conflicting pair and backing states decoded jointly (trip_jax/evaluation/decoding.py).
        "decoding.method": "coherent",
        # A state is asserted at probability >= 0.5 only, and an object named twice in a story
        # gets its states under one name (trip_jax/evaluation/decoding.py).
        "decoding.state_threshold": 0.5,
        "decoding.alias_states": True,
        # At the decoded conflict's two sentences, a state is asserted at probability >= 0.95
        # only, and the decoded contradiction's two states are written only at probability
        # >= 0.9 (chosen by 5-fold CV on dev: results/cv_minilm/cv_sweep.md).
        "decoding.conflict_state_threshold": 0.95,
        "decoding.min_flip_probability": 0.9,
        # Heads and detector start from scratch: a higher peak rate, warm-up and linear decay.
        "train.head_learning_rate": 2e-3,
        "train.schedule": "warmup_linear",
        # Selection robust to a small held-out slice (trip_jax/training/selection.py).
        "train.selection": "smoothed",
    },
}


def parse_argument(argument: str | None, default_mode: str, default_preset: str = "reference"
                   ) -> tuple[str, str, str]:
    """Splits the config argument ("exact", "all", "coherent,clean", ...) into (mode, model
    preset, loss preset), filling in ``default_mode``, ``default_preset`` and
    ``DEFAULT_LOSS_PRESET``."""
    kinds = {"mode": REFERENCE_MODES, "model preset": PRESETS, "loss preset": LOSS_PRESETS}
    chosen: dict[str, str] = {}
    for token in filter(None, (t.strip() for t in (argument or "").split(","))):
        kind = next((k for k, names in kinds.items() if token in names), None)
        if kind is None:
            raise ValueError(unknown_choice("loss preset, model preset or mode", token,
                                            [*sorted(LOSS_PRESETS), *PRESETS, *REFERENCE_MODES]))
        if kind in chosen:
            raise ValueError(f"config argument {argument!r} names two {kind}s")
        chosen[kind] = token
    preset = chosen.get("model preset", default_preset)
    return (chosen.get("mode", default_mode), preset,
            chosen.get("loss preset", DEFAULT_LOSS_PRESET))


def get_key(config: ml_collections.ConfigDict, dotted: str) -> object:
    """The value of one dotted key ("model.tiered.cells") of ``config``."""
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def set_keys(config: ml_collections.ConfigDict, values: dict[str, object]) -> None:
    """Sets every dotted key of ``values`` ("model.tiered.cells": ...) in ``config``."""
    for dotted, value in values.items():
        parent, _, key = dotted.rpartition(".")
        node = get_key(config, parent) if parent else config
        node[key] = value


def apply_reference_mode(config: ml_collections.ConfigDict, mode: str) -> None:
    """Sets every key of ``REFERENCE_MODES[mode]`` in ``config``."""
    if mode not in REFERENCE_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(REFERENCE_MODES)}")
    set_keys(config, REFERENCE_MODES[mode])


def reference_mode(config: ml_collections.ConfigDict) -> str:
    """The mode whose every key ``config`` has ("exact", "clean"), else "mixed"."""
    for mode, values in REFERENCE_MODES.items():
        if all(get_key(config, k) == v for k, v in values.items()):
            return mode
    return "mixed"


def get_config(argument: str | None = None, *, default_mode: str = "clean",
               default_preset: str = "reference") -> ml_collections.ConfigDict:
    """Returns the base configuration for a config argument (module docstring: mode, model
    preset and loss preset); the defaults apply to what the argument does not name. The model
    preset's name is kept as ``config.preset``."""
    mode, model_preset, loss_preset = parse_argument(argument, default_mode, default_preset)
    config = fields.config_dict(sections.Config)  # every key at its schema default
    set_keys(config, dict(zip(("loss.pre_weight", "loss.eff_weight", "loss.conflict_weight",
                               "loss.story_weight"), LOSS_PRESETS[loss_preset])))
    apply_reference_mode(config, mode)
    set_keys(config, PRESETS[model_preset])
    config.preset = model_preset
    return config
