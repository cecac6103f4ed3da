"""The base config: every key at its schema default, a mode, a model preset and a loss preset.

The keys, their defaults, types, allowed values and help are declared once, in
``trip_jax/config/sections.py``; ``get_config`` builds the ConfigDict from there and sets the
keys of the chosen mode and presets (the tables below).

Not run directly: ``roberta.py``, ``bert.py``, ``deberta.py``, ``minilm.py`` and ``tiny.py`` call
``get_config()`` and change the encoder and its learning rate.

The optional config argument is a comma-separated list of at most one mode, at most one model
preset and at most one loss preset, in any order: ``--config=configs/roberta.py:clean,all``.
- Mode (``REFERENCE_MODES``): ``exact`` sets every key in which the original implementation's
  training step differs from the cleaned-up one to the original's (padding cells fed the
  encoder's vector of an all-zero, fully masked row; unmasked detector and losses; entities
  padded to the data's largest count; token type ids all 0; transformers.AdamW; rows cut at 16
  tokens, with a report; heads and detector on every cell, each row encoded on its own, so each
  draws its own dropout); ``clean`` sets them to the cleaned-up variant (padding cells zero and
  masked out of the detector and the losses, entities bucketed per batch, the tokenizer's
  segment type ids, optax AdamW, no cut, heads and detector on real cells only and rows with
  equal tokens encoded once: the same outputs, fewer dropout draws). The paper configs
  (roberta, bert, deberta) default to ``exact``, minilm and tiny to ``clean``.
  ``docs/exact-mode.md`` lists every key and its measured effect; each key can also be set alone.
- Model preset (``PRESETS``): ``reference`` (the paper's model, trained and decoded as the
  paper did; the default of roberta, bert, deberta and tiny) or ``coherent`` (the improvements of
  this project, for any encoder; the default of minilm): every key it sets is listed in
  ``PRESETS`` and its measured effect in ``docs/results.md``.
- Loss preset: a loss row of the paper's Table 2: ``omit_story`` (default, the paper's best),
  ``all``, ``omit_conflict`` or ``omit_states``.
Any key can be overridden on the command line (``--config.train.learning_rate=2e-5``, also
after a mode: ``:exact --config.data.token_types=segments`` studies one difference alone); a
misspelt key is an error.
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
