"""The config schema (trip_jax/config/): one declaration per key, the checks and configs/base.py
read off it, and saved configs of every version read through one migration."""

import dataclasses
import json
import pathlib
import re

import pytest

from configs import base, minilm
from trip_jax.data import layouts
from trip_jax.models import builders
from trip_jax.training import checkpoints, optimizers
from trip_jax.config import fields, migrate, sections
from trip_jax.config.messages import ConfigError
from trip_jax.config.typed import as_dict, replace, typed
from trip_jax.data import features, readers
from trip_jax import encoder_registry as registry
from trip_jax.models import tiered

REPO = pathlib.Path(__file__).resolve().parents[1]
# Saved configs of every version: the committed runs (results/archive/ aside, which no test reads)
# and, in tests/fixtures/saved_configs/, one of each shape the archived runs were saved in.
SAVED_CONFIGS = REPO / "tests" / "fixtures" / "saved_configs"
OLD_CONFIGS = sorted(p for p in REPO.glob("results/**/config.json") if "archive" not in p.parts)
OLD_CONFIGS += sorted(SAVED_CONFIGS.glob("*.json"))


def test_every_key_is_declared_once_with_help_and_base_builds_from_the_schema():
    assert all(key.help for key in sections.KEYS.values())
    built = migrate.flatten(json.loads(base.get_config().to_json()))
    assert list(built) == list(sections.KEYS)  # the same keys, in the schema's order
    # A key no fidelity or recipe sets keeps its schema default.
    assert built["train.learning_rate"] == sections.TrainConfig().learning_rate == 1e-5
    assert built["config_version"] == sections.CONFIG_VERSION


def test_the_schema_declares_choices_and_ranges():
    assert sections.KEYS["model.tiered.cells"].choices == ("grid", "real")
    assert sections.KEYS["train.batch_size"].rule.allowed == ">= 1"


@pytest.mark.parametrize("key, implemented", [
    ("data.format", ("", *readers.FORMATS)),
    ("data.layout", layouts.NAMES),
    ("data.token_types", features.TOKEN_TYPES),
    ("data.entity_padding", layouts.ENTITY_PADDINGS),
    ("model.dtype", tuple(builders.DTYPES)),
    ("model.random_encoder.model_type", registry.MODEL_TYPES),
    ("model.tiered.detector_activation", tuple(sorted(tiered._ACTIVATIONS))),
    ("train.optimizer", optimizers.OPTIMIZERS),
    ("train.schedule", optimizers.SCHEDULES),
])
def test_each_choice_is_what_the_module_using_it_implements(key, implemented):
    assert sections.KEYS[key].choices == tuple(implemented)


def test_schema_names_shared_with_other_modules_agree():
    assert sections.CHECKPOINT_KINDS == checkpoints.KINDS
    # features.Buckets has no defaults of its own: the schema is the one place.
    assert ([f.name for f in dataclasses.fields(sections.BucketsConfig)]
            == [f.name for f in dataclasses.fields(features.Buckets)])
    assert features.Buckets(**dataclasses.asdict(sections.BucketsConfig()))


@pytest.mark.parametrize("section, values, message", [
    (sections.DataConfig, {"layout": "packd"}, "config key data.layout: unknown value 'packd'"),
    (sections.TrainConfig, {"batch_size": 0},
     "bad value for --config.train.batch_size: 0 (allowed: >= 1)"),
    (sections.MeshConfig, {"data": 0}, "bad value for --config.mesh.data: 0 (allowed: -1 (every"),
    (sections.LossConfig, {"pre_weight": -1.0}, "loss.pre_weight: -1.0 (allowed: >= 0)"),
])
def test_a_section_refuses_a_value_outside_its_declaration(section, values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        section(**values)


def test_a_config_file_with_a_key_outside_the_schema_is_refused():
    config = base.get_config()
    config.train.learnin_rate = 1.0
    with pytest.raises(ConfigError, match="unknown config key train.learnin_rate; did you "
                                          "mean train.learning_rate"):
        typed(config)
    config = base.get_config()
    del config.mesh["fsdp"]
    with pytest.raises(ConfigError, match="the config has no key mesh.fsdp"):
        typed(config)


def test_the_typed_config_is_the_config_files_and_writes_back_the_same_json():
    config = minilm.get_config()
    built = typed(config)
    assert typed(built) is built  # an entry point passes it down as it is
    assert built.model.tiered == sections.TieredConfig(**config.model.tiered.to_dict())
    assert json.dumps(as_dict(built), indent=2) == config.to_json(indent=2)
    changed = replace(built, {"data.fold": 3, "data.protocol": "dev_cv"})
    assert (changed.data.fold, changed.data.protocol, built.data.fold) == (3, "dev_cv", 0)
    with pytest.raises(ConfigError, match="data.fold"):
        replace(built, {"data.fold": -1})


def test_a_current_config_migrates_to_itself():
    current = json.loads(base.get_config("recipe=tuned").to_json())
    assert migrate.migrate(current, "here") == current


def removed_values(old: dict) -> dict:
    """The keys of a flat saved config set to a value a later version can no longer read, in
    the order migrate checks them."""
    removed = {key: kept for step in migrate.STEPS.values() for key, kept in step.removed.items()}
    return {key: old[key] for key, kept in removed.items() if key in old and old[key] != kept}


@pytest.mark.parametrize("path", OLD_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_old_config_migrates_keeping_its_values_or_names_what_was_removed(path):
    old = migrate.flatten(json.loads(path.read_text()))
    removed = removed_values(old)
    if removed:
        # E.g. the tuned recipe's runs before issue 24's ablation (state_transitions=True).
        key, value = next(iter(removed.items()))
        with pytest.raises(migrate.ConfigError, match=f"{path}: {key}={value!r} was removed"):
            migrate.migrate(json.loads(path.read_text()), str(path))
        return
    new = migrate.flatten(migrate.migrate(json.loads(path.read_text()), str(path)))
    assert list(new) == list(sections.KEYS)
    for step in list(migrate.STEPS.values())[old.get("config_version", 0):]:
        migrate.apply_renames(old, step)  # renamed keys and values under their new names
    assert new["config_version"] == sections.CONFIG_VERSION
    gone = {key for step in migrate.STEPS.values() for key in (*step.removed, *step.dropped)}
    assert {k: new[k] for k in old if k not in gone | {"config_version"}} == {
        k: v for k, v in old.items() if k not in gone | {"config_version"}}
    for key in set(new) - set(old) - {"config_version"}:
        # Added later: the value that behaves as the code did before the key existed.
        expected = migrate.STEPS[0].added.get(key, sections.KEYS[key].default)
        assert new[key] == expected, key


def test_old_configs_read_as_the_run_was_configured():
    # The pruned recipe's seed 22 (issue 24): configs/minilm.py before issue 43's CV decided its
    # protocol and decoding thresholds, but for the compilation cache and where the weights were
    # installed.
    path = SAVED_CONFIGS / "minilm_coherent_pruned.seed22.json"
    migrated = migrate.flatten(migrate.migrate(json.loads(path.read_text()), str(path)))
    expected = migrate.flatten(json.loads(minilm.get_config().to_json()))
    expected.update({"data.protocol": "auto", "decoding.conflict_state_threshold": 0.9,
                     "decoding.min_flip_probability": 0.0, "model.unroll_encoder": False})
    local = ("train.compilation_cache_dir", "model.encoder")
    assert {k: v for k, v in migrated.items() if k not in local} == {
        k: v for k, v in expected.items() if k not in local}
    # Runs of the tuned recipe with state_transitions (before issue 24's ablation) are refused
    # as a whole, but one key (a summary needs the seed) still reads.
    refused = [p for p in OLD_CONFIGS if removed_values(migrate.flatten(json.loads(p.read_text())))]
    assert refused
    for path in refused:
        saved = json.loads(path.read_text())
        assert migrate.read_key(saved, "train.seed", str(path)) == saved["train"]["seed"]
    with pytest.raises(migrate.ConfigError, match="W: config key train.sed is missing"):
        migrate.read_key(saved, "train.sed", "W")
    # The random baseline's config predates dedup_rows, cells and the decoding section.
    path = REPO / "results/random_baseline/config.json"
    migrated = migrate.migrate(json.loads(path.read_text()), str(path))
    assert migrated["data"]["dedup_rows"] is False
    assert migrated["model"]["tiered"]["cells"] == "grid"
    assert migrated["decoding"] == dataclasses.asdict(sections.DecodingConfig())
    assert sections.TieredConfig.from_mapping(migrated["model"]["tiered"]).cells == "grid"


def test_version_6_configs_read_under_the_names_of_issue_45_stage_3():
    # The model preset became the recipe (reference -> paper, coherent -> tuned), decoding
    # "reference" became "independent", decoding.conflict_weight became detector_weight.
    for recipe, old_preset, old_method in (("tuned", "coherent", "coherent"),
                                           ("paper", "reference", "reference")):
        saved = json.loads(base.get_config(f"recipe={recipe}").to_json())
        saved["config_version"] = 6
        saved["preset"] = old_preset
        del saved["recipe"]
        saved["decoding"]["method"] = old_method
        saved["decoding"]["conflict_weight"] = saved["decoding"].pop("detector_weight") + 0.5
        migrated = migrate.migrate(saved, "W/config.json")
        assert migrated["recipe"] == recipe and "preset" not in migrated
        assert migrated["decoding"]["method"] == base.get_config(
            f"recipe={recipe}").decoding.method
        assert migrated["decoding"]["detector_weight"] == 0.5
        assert "conflict_weight" not in migrated["decoding"]
        assert migrated["loss"]["conflict_weight"] == saved["loss"]["conflict_weight"]  # λc
        assert migrate.read_key(saved, "recipe", "W") == recipe
        assert migrate.read_key(saved, "decoding.detector_weight", "W") == 0.5


@pytest.mark.parametrize("change, message", [
    (lambda c: (c.pop("config_version"), c["decoding"].update(backing_threshold=0.35)),
     "decoding.backing_threshold=0.35 was removed"),
    (lambda c: c["train"].update(learnin_rate=0.1),
     "unknown config key train.learnin_rate; did you mean train.learning_rate"),
    (lambda c: c.update(config_version=sections.CONFIG_VERSION + 1),
     f"config_version {sections.CONFIG_VERSION + 1} is not"),
    (lambda c: c["mesh"].pop("fsdp"),
     f"config key mesh.fsdp is missing (config_version {sections.CONFIG_VERSION})"),
    (lambda c: (c.update(config_version=2), c["model"]["tiered"].update(state_transitions=True)),
     "model.tiered.state_transitions=True was removed"),
])
def test_a_saved_config_no_version_reads_is_one_line_naming_the_key(change, message):
    config = json.loads(base.get_config().to_json())
    change(config)
    with pytest.raises(migrate.ConfigError) as error:
        migrate.migrate(config, "W/config.json")
    assert str(error.value).startswith("W/config.json: ") and message in str(error.value)
    assert "\n" not in str(error.value)
    if "was removed" in message:  # too old for this trip_jax: what to do instead
        assert str(error.value).endswith(": train the run again, or read it with the trip_jax "
                                         "that wrote it")
    with pytest.raises(checkpoints.CheckpointError, match="the config of W"):
        checkpoints.saved_config(config, "W")


def test_an_unversioned_config_without_the_removed_key_set_reads():
    config = json.loads(base.get_config().to_json())
    del config["config_version"]
    config["decoding"]["backing_threshold"] = 0.0
    assert migrate.migrate(config, "old") == json.loads(base.get_config().to_json())
    assert fields.config_dict(sections.Config).to_dict() == migrate.nest(
        {k: key.default for k, key in sections.KEYS.items()})
