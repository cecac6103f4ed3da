"""Reading a saved config (a workdir's config.json, a checkpoint's meta) written by any version.

``migrate(values, where)`` takes saved JSON values and returns them at ``CONFIG_VERSION`` through
the ``STEPS`` (one ``Step`` per version); what cannot be read is a one-line ``ConfigError``.
Readers of saved configs call this and nothing else. Details: docs/reference.md#allowed-values.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from trip_jax.config.messages import ConfigError, closest
from trip_jax.config.fields import config_dict
from trip_jax.config.sections import CONFIG_VERSION, KEYS, Config


@dataclasses.dataclass(frozen=True)
class Step:
    """What changed from one config version to the next (module docstring)."""

    renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # {key (its new name): {old value: new value}}: a value renamed, applied after ``renamed``.
    revalued: Mapping[str, Mapping[Any, Any]] = dataclasses.field(default_factory=dict)
    removed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    added: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    defaults: bool = False


# Every step is kept while committed results are saved at versions below it: results/archive/
# (version 0, and 3 for minilm_coherent_pruned/), results/cv_minilm_coherent_pruned/ (3),
# results/cv_minilm/ (5), results/minilm/ (6); tests/fixtures/saved_configs/ holds their shapes.
STEPS: dict[int, Step] = {
    0: Step(
        # Removed when it moved verifiability by a pair or less (docs/results.md); 0 was off.
        removed={"decoding.backing_threshold": 0.0},
        # Before data.dedup_rows existed every row was encoded (its default is now True).
        added={"data.dedup_rows": False},
        defaults=True),
    # The packed layout and its short-row group were retired (a config naming layout "packed"
    # is refused by the schema, sections.LayoutName).
    1: Step(removed={"data.short_seq_len": 0},
            dropped=("data.buckets.row_min", "data.buckets.rows_per_octave"),
            # Declared since; Hugging Face's defaults, which a random encoder had before.
            added={"model.random_encoder.hidden_dropout_prob": 0.1,
                   "model.random_encoder.attention_probs_dropout_prob": 0.1}),
    # Issue 24's ablation: neither option raised consistency + verifiability (docs/results.md,
    # "Ablation"); runs trained with them are refused (their models or losses differ).
    2: Step(removed={"model.tiered.state_transitions": False,
                     "loss.conflict_positive_weight": 1.0,
                     "model.tiered.story_score": "sum"},
            dropped=("model.tiered.transitions_init_weight",)),
    # Issue 33: the dev_cv protocol's folds and the decoding lever for the implicit pairs, off.
    3: Step(added={"data.folds": 5, "data.fold": 0, "decoding.min_flip_probability": 0.0}),
    # Issue 43: cross-validation decodes each fold under cv.sweep as the fold ends. Issue 42:
    # the matmul precision, the device's default before.
    4: Step(added={"cv.sweep": ""}),
    # Issue 42: matmul precision became a key; runs before it computed at JAX's default.
    5: Step(added={"model.matmul_precision": "default"}),
    # Issue 45 stage 3, one word one meaning (docs/reference.md, "Renames"): the model preset
    # became the recipe (reference -> paper, coherent -> tuned), decoding "reference" became
    # "independent", and the detector's weight in coherent decoding got its own name. Issue 42:
    # the encoder's scan unrolled or not (the same values; rolled before).
    6: Step(renamed={"preset": "recipe", "decoding.conflict_weight": "decoding.detector_weight"},
            revalued={"recipe": {"reference": "paper", "coherent": "tuned"},
                      "decoding.method": {"reference": "independent"}},
            added={"model.unroll_encoder": False}),
}


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections -> {dotted key: value} (the leaves only)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{dotted key: value} of every schema key -> nested sections in the schema's key order."""
    out = json.loads(config_dict(Config).to_json())  # to_json keeps the declaration order
    for key, value in flat.items():
        *sections, name = key.split(".")
        node = out
        for section in sections:
            node = node[section]
        node[name] = value
    return out


def migrate(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (a saved config, plain JSON values) brought to ``CONFIG_VERSION``; ``where``
    (the file or checkpoint it came from) names it in a ``ConfigError``."""
    flat = flatten(copy.deepcopy(dict(values)))
    version = flat.pop("config_version", 0)
    if not isinstance(version, int) or not 0 <= version <= CONFIG_VERSION:
        raise ConfigError(f"{where}: config_version {version!r} is not one this trip_jax reads "
                          f"(0 to {CONFIG_VERSION}); use the trip_jax that wrote it")
    for step in (STEPS[v] for v in range(version, CONFIG_VERSION)):
        apply_renames(flat, step)
        for key, kept in step.removed.items():
            if key in flat and flat.pop(key) != kept:
                raise ConfigError(f"{where}: {key}={values_of(values, key)!r} was removed; only "
                                  f"{kept!r} (what the code does now) can be read: train the "
                                  "run again, or read it with the trip_jax that wrote it")
        for key in step.dropped:
            flat.pop(key, None)
        for key, value in step.added.items():
            flat.setdefault(key, value)
        if step.defaults:
            for key, declared in KEYS.items():
                flat.setdefault(key, declared.default)
    flat["config_version"] = CONFIG_VERSION
    for key in flat:
        if key not in KEYS:
            hint = closest(key, KEYS)
            raise ConfigError(f"{where}: unknown config key {key}"
                              + (f"; did you mean {hint}?" if hint else ""))
    for key in KEYS:
        if key not in flat:
            raise ConfigError(f"{where}: config key {key} is missing (config_version "
                              f"{version})")
    return nest(flat)


def read_key(values: Mapping[str, Any], dotted: str, where: str) -> Any:
    """One key (current dotted name) of a saved config of any version, without migrating the
    rest: readable also where another key holds a value this version refuses (a summary of
    an old run's reports needs its seed, not its model). ``ConfigError`` if it has no such key."""
    flat = flatten(values)
    version = flat.get("config_version", 0)
    for step in (STEPS[v] for v in range(version, CONFIG_VERSION)):
        apply_renames(flat, step)
    if dotted not in flat:
        raise ConfigError(f"{where}: config key {dotted} is missing (config_version {version})")
    return flat[dotted]


def apply_renames(flat: dict[str, Any], step: Step) -> None:
    """Moves the keys ``step`` renamed to their new names and renames the values it renamed,
    in place."""
    for old, new in step.renamed.items():
        if old in flat:
            flat[new] = flat.pop(old)
    for key, names in step.revalued.items():
        if key in flat and isinstance(flat[key], str) and flat[key] in names:
            flat[key] = names[flat[key]]


def values_of(values: Mapping[str, Any], dotted: str) -> Any:
    """The value of one dotted key of nested ``values``."""
    return flatten(values)[dotted]
