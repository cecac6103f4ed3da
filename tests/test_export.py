"""Every encoder family's tiny train and eval steps export with ``jax.export`` for cuda and tpu
from this CPU; the exported eval step, run here, computes what the jitted one does."""

import json

import jax
import numpy as np
import pytest

from benchmarks import export_steps
from trip_jax.config.typed import typed
from trip_jax.data.tokenizers import build_word_level_tokenizer
from trip_jax import encoder_registry as registry
from trip_jax.models import builders
from trip_jax.runtime import sharding
from trip_jax.training.step import build_trainer

TEXTS = ["john opened the fridge", "the pan is hot"]


def _trainer(tiny_config, family):
    config = tiny_config()
    config.model.random_encoder.model_type = family.model_types[0]
    config.model.tokenizer = f"word_level:{family.tokenizer.name}"
    config = typed(config)
    tokenizer = build_word_level_tokenizer(TEXTS, style=family.tokenizer.name)
    hf_config, _ = builders.build_encoder_config(config.model, tokenizer)
    model = builders.build_model(config, hf_config)
    return build_trainer(config, model, sharding.create_mesh(config.mesh), total_steps=4)


@pytest.mark.parametrize("family", registry.families(), ids=lambda f: f.name)
def test_tiny_steps_export_for_cuda_and_tpu(tiny_config, family):
    trainer = _trainer(tiny_config, family)
    steps = export_steps.export_steps(trainer)
    state = trainer.abstract_state
    for name, args in (("train", (state, None)), ("eval", (state.params, None))):
        exported = steps[name]["exported"]
        assert exported.platforms == ("cuda", "tpu")
        leaves = len(jax.tree.leaves(args[0]))
        assert len(exported.in_avals) > leaves  # the state's (or the parameters') and the batch's
        assert "stablehlo" in exported.mlir_module()
        assert steps[name]["stablehlo_bytes"] > steps[name]["bytecode_bytes"] > 0
        assert steps[name]["seconds"] > 0
    # The train step returns the next state: its parameters' shapes are the inputs'.
    train = steps["train"]["exported"]
    assert train.out_avals[:len(jax.tree.leaves(state))] == train.in_avals[:len(
        jax.tree.leaves(state))]


def test_an_exported_eval_step_computes_the_jitted_ones_outputs(tiny_config):
    trainer = _trainer(tiny_config, registry.family_of("t5"))
    exported = export_steps.export_steps(trainer, platforms=("cpu", "cuda", "tpu"))["eval"]
    params = trainer.fresh_state().params
    batch = builders.example_batch(trainer.config.data.max_sentences,
                                   seq_len=export_steps.SEQ_LEN)
    batch["input_ids"][:] = np.arange(batch["input_ids"].size).reshape(
        batch["input_ids"].shape) % 9 + 3
    ours = exported["exported"].call(params, batch)
    jitted = trainer.eval_step(params, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), ours,
                 jitted)


def test_the_committed_export_table_is_its_records_and_the_readmes(repo):
    result = json.loads((repo / "benchmarks" / "results" / "export_steps.json").read_text())
    assert result["platforms"] == list(export_steps.PLATFORMS)
    assert result["markdown"] == export_steps.table(result["records"])
    assert result["markdown"] in (repo / "benchmarks" / "README.md").read_text()
    assert [r["config"] for r in result["records"]] == [
        f"configs/{name}.py" for name in export_steps.ENCODERS]
    for name, values in export_steps.ENCODERS.items():
        assert registry.family_of(values["model_type"]).name == name
