"""The base config: every key at its schema default, plus a fidelity, a recipe and a loss preset.

Not run directly: the other configs call ``get_config()``. Their argument sets up to three
``key=value``: ``fidelity`` (``FIDELITIES``), ``recipe`` (``RECIPES``) and ``losses``
(``LOSS_PRESETS``), e.g. ``roberta.py:fidelity=clean,losses=all``. Details: README.md#training.
"""

import ml_collections

from trip_jax.config.messages import unknown_choice
from trip_jax.config import fields, sections
from trip_jax.config.sections import LOSS_PRESETS

DEFAULT_LOSS_PRESET = "omit_story"

# The keys in which the original implementation's step differs from the cleaned-up variant,
# with each fidelity's values (docs/fidelity.md: what each one does and its measured effect).
FIDELITIES: dict[str, dict[str, object]] = {
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
# (``--config=configs/roberta.py:recipe=tuned``); "paper" sets nothing. docs/results.md gives
# each key's measured effect (the ablation table).
RECIPES: dict[str, dict[str, object]] = {
    "paper": {},
    "tuned": {
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


# The config argument's keys, each with its choices.
ARGUMENTS: dict[str, dict] = {"fidelity": FIDELITIES, "recipe": RECIPES, "losses": LOSS_PRESETS}


def parse_argument(argument: str | None, default_fidelity: str, default_recipe: str = "paper"
                   ) -> tuple[str, str, str]:
    """Splits the config argument ("fidelity=exact", "recipe=tuned,losses=all", ...) into
    (fidelity, recipe, loss preset), filling in ``default_fidelity``, ``default_recipe`` and
    ``DEFAULT_LOSS_PRESET``."""
    chosen: dict[str, str] = {}
    for item in filter(None, (t.strip() for t in (argument or "").split(","))):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals:
            owner = next((k for k, values in ARGUMENTS.items() if item in values), None)
            hint = f"did you mean {owner}={item}?" if owner else "e.g. fidelity=exact"
            raise ValueError(f"config argument {item!r} is not KEY=VALUE; {hint} "
                             f"(keys: {', '.join(ARGUMENTS)})")
        if key not in ARGUMENTS:
            raise ValueError(unknown_choice("config argument key", key, ARGUMENTS))
        if value not in ARGUMENTS[key]:
            raise ValueError(unknown_choice(key, value, ARGUMENTS[key]))
        if key in chosen:
            raise ValueError(f"config argument {argument!r} names {key} twice")
        chosen[key] = value
    return (chosen.get("fidelity", default_fidelity), chosen.get("recipe", default_recipe),
            chosen.get("losses", DEFAULT_LOSS_PRESET))


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


def apply_fidelity(config: ml_collections.ConfigDict, fidelity: str) -> None:
    """Sets every key of ``FIDELITIES[fidelity]`` in ``config``."""
    if fidelity not in FIDELITIES:
        raise ValueError(unknown_choice("fidelity", fidelity, FIDELITIES))
    set_keys(config, FIDELITIES[fidelity])


def fidelity_of(config: ml_collections.ConfigDict) -> str:
    """The fidelity whose every key ``config`` has ("exact", "clean"), else "mixed"."""
    for fidelity, values in FIDELITIES.items():
        if all(get_key(config, k) == v for k, v in values.items()):
            return fidelity
    return "mixed"


def get_config(argument: str | None = None, *, default_fidelity: str = "clean",
               default_recipe: str = "paper") -> ml_collections.ConfigDict:
    """Returns the base configuration for a config argument (module docstring: fidelity, recipe
    and loss preset); the defaults apply to what the argument does not name. The recipe's name
    is kept as ``config.recipe``."""
    fidelity, recipe, loss_preset = parse_argument(argument, default_fidelity, default_recipe)
    config = fields.config_dict(sections.Config)  # every key at its schema default
    set_keys(config, dict(zip(("loss.pre_weight", "loss.eff_weight", "loss.conflict_weight",
                               "loss.story_weight"), LOSS_PRESETS[loss_preset])))
    apply_fidelity(config, fidelity)
    set_keys(config, RECIPES[recipe])
    config.recipe = recipe
    return config
