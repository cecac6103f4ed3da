"""The encoder families: one registry, read by every module that needs a family's knowledge."""

import ast
import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import transformers

from trip_jax.config import sections
from trip_jax.data import tokenizers
from trip_jax import encoder_registry as registry
from trip_jax import encoder_registry as contract
from trip_jax.models import param_names
from trip_jax.reference import padding_row

REPO = pathlib.Path(__file__).resolve().parents[1]
# Modules that may write a family's model_type: the units and their list, the Flax encoders they
# serve, and two that name something else: the config's default random encoder and the authors'
# pickled model classes (interop, not an encoder family here).
_MAY_NAME = ("trip_jax/models/families/", "trip_jax/encoder_registry.py",
             "trip_jax/config/sections.py", "trip_jax/interop/authors_model.py")
TINY = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32, pad_token_id=1)
_CONFIGS = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig,
            "deberta": transformers.DebertaConfig, "deberta-v2": transformers.DebertaV2Config,
            "mpnet": transformers.MPNetConfig}


def test_each_model_type_has_one_family_and_the_readers_agree():
    families = registry.families()
    types = [t for f in families for t in f.model_types]
    assert len(types) == len(set(types)) and tuple(types) == registry.MODEL_TYPES
    assert [f.name for f in families] == list(registry.UNITS)
    assert sections.KEYS["model.random_encoder.model_type"].choices == registry.MODEL_TYPES
    assert set(registry.tokenizer_styles()) == {f.tokenizer.name for f in families}
    for family in families:
        assert isinstance(family, contract.Family)
        assert all(registry.family_of(t) is family for t in family.model_types)
        assert (family.layers.stacked, family.layers.per_layer) in param_names._stacks()
    with pytest.raises(ValueError, match="model_type='gpt2'; supported: bert, roberta"):
        registry.family_of("gpt2")


def test_no_module_outside_the_units_names_a_family(parse_python):
    found = []
    for path in sorted((REPO / "trip_jax").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name.startswith(_MAY_NAME):
            continue
        for node in ast.walk(parse_python(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in registry.MODEL_TYPES:
                found.append(f"{name}:{node.lineno} {node.value!r}")
    assert not found, found


@pytest.mark.parametrize("model_type", list(_CONFIGS))
def test_build_encoder_serves_each_model_type_with_its_family_module(model_type):
    config = _CONFIGS[model_type](**TINY)
    family = registry.family_of(model_type)
    module = registry.build_encoder(config, remat=True)
    assert type(module) is type(family.build(config)) and module.remat
    ids = jnp.array([[0, 5, 6, 2, 1]], jnp.int32)
    hidden = module.apply(module.init(jax.random.key(0), ids, jnp.ones_like(ids)), ids,
                          jnp.ones_like(ids))
    assert hidden.shape == (1, 5, 16)
    if family.capabilities.mask_bias:
        assert padding_row.mask_bias_for(module, "legacy") == padding_row.LEGACY_MASK_BIAS
    else:
        with pytest.raises(ValueError, match="use 'masked' for"):
            padding_row.mask_bias_for(module, "legacy")


@pytest.mark.parametrize("style", list(registry.tokenizer_styles()))
def test_each_tokenizer_style_builds_a_word_level_tokenizer_it_recognises(style):
    spec = registry.tokenizer_styles()[style]
    tokenizer = tokenizers.load_tokenizer(f"word_level:{style}", texts=["a b c"])
    info = tokenizers.tokenizer_info(tokenizer)
    assert (info.style, info.uses_token_type_ids) == (style, spec.token_types)
    assert info.pad_id == list(spec.special_tokens).index("pad_token")
    ids = tokenizer("a", "b")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "a" if piece.startswith("$A") else "b" if piece.startswith("$B") else piece.split(":")[0]
        for piece in spec.pair.split()]


def test_the_config_reads_the_model_types_without_importing_a_unit_or_jax(repo):
    code = ("import sys, trip_jax.config.sections as s; "
            "print(s.KEYS['model.random_encoder.model_type'].choices, "
            "sorted(m for m in sys.modules if m.startswith(('jax', 'flax', "
            "'trip_jax.models.families'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.stdout.strip() == f"{registry.MODEL_TYPES} []"


def test_a_unit_that_disagrees_with_the_registry_is_named(monkeypatch):
    from trip_jax.models.families import t5
    monkeypatch.setattr(t5, "FAMILY", dataclasses.replace(t5.FAMILY, model_types=("t5", "mt5")))
    registry.families.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"families/t5.py: FAMILY is 't5' serving "
                                             r"\('t5', 'mt5'\)"):
            registry.families()
    finally:
        monkeypatch.undo()
        registry.families.cache_clear()
