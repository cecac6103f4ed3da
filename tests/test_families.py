"""The encoder families: one registry, read by every module that needs a family's knowledge, and
the checks every family gets from it: parity with Hugging Face's PyTorch model on padded and
packed rows from both checkpoint formats, token types ignored where it has none, a tiny run of
the tiered model on its random encoder, its config (its export: tests/test_export.py)."""

import ast
import dataclasses
import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import encoder_parity as parity
from trip_jax import train
from trip_jax.config import sections
from trip_jax.config.typed import typed
from trip_jax.data import tokenizers
from trip_jax import encoder_registry as registry
from trip_jax import encoder_registry as contract
from trip_jax.models import builders, param_names, weights
from trip_jax.runtime import pypi_copies
from trip_jax.training import checkpoints
from trip_jax.reference import padding_row

REPO = pathlib.Path(__file__).resolve().parents[1]
# Modules that may write a family's model_type: the units and their list, the Flax encoders they
# serve, and two that name something else: the config's default random encoder and the authors'
# pickled model classes (interop, not an encoder family here).
_MAY_NAME = ("trip_jax/models/families/", "trip_jax/encoder_registry.py",
             "trip_jax/config/sections.py", "trip_jax/interop/authors_model.py")
TINY = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32, pad_token_id=1)
PARITY_TOL = 1e-4
# Config keywords a family's parity runs with, by model type and variant ("" the random
# encoder's config as its unit maps it); a model type not listed runs that one alone.
VARIANTS = {
    # RoBERTa's eps, and the tanh GELU to cover it.
    "roberta": {"": dict(layer_norm_eps=1e-5, hidden_act="gelu_new")},
    # 8 buckets over distances up to 20: rows of 12 tokens reach the logarithmic buckets;
    # v1.1 / Flan's gated GELU (the unit's) and v1.0's ReLU.
    "t5": {"v1.1": dict(relative_attention_num_buckets=8, relative_attention_max_distance=20),
           "v1.0": dict(relative_attention_num_buckets=8, relative_attention_max_distance=20,
                        feed_forward_proj="relu")},
    # Layers 0 and 2 global, 1 local with a window of 2 tokens each side; without and with
    # biases.
    "modernbert": {"plain": dict(num_hidden_layers=3, local_attention=4,
                                 global_attn_every_n_layers=2),
                   "biased": dict(num_hidden_layers=3, local_attention=4,
                                  global_attn_every_n_layers=2, norm_bias=True,
                                  attention_bias=True, mlp_bias=True)},
}
CASES = [(t, v) for f in registry.families() for t in f.model_types
         for v in VARIANTS.get(t, {"": {}})]
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


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """(model type, variant) -> (torch model, safetensors directory, .bin directory), made on
    first use."""
    made = {}

    def get(model_type, variant):
        if (model_type, variant) not in made:
            model = parity.tiny_torch_model(model_type,
                                            **VARIANTS.get(model_type, {"": {}})[variant])
            root = tmp_path_factory.mktemp(f"{model_type}_{variant or 'default'}")
            made[model_type, variant] = (model, *parity.save_both(model, root))
        return made[model_type, variant]
    return get


def _settings(config) -> dict:
    """A transformers config's values, less where it was read from."""
    return {k: v for k, v in config.to_dict().items()
            if k not in ("_name_or_path", "transformers_version")}


def _load_with_report(directory):
    """(hf_config, params, LoadReport, the checkpoint's tensor names) of ``directory``."""
    config, params = weights.load_pretrained(directory)
    family = registry.family_of(config.model_type)
    checkpoint, source = weights.read_checkpoint(directory)
    names = [".".join(path) for path in checkpoint]
    if family.convert is not None:
        checkpoint = family.convert(checkpoint)
    _, report = weights.convert_checkpoint(checkpoint, weights.expected_params(config),
                                           source=source,
                                           ignore_unexpected=family.ignore_unexpected)
    return config, params, report, names


@pytest.mark.usefixtures("highest_matmul_precision")
@pytest.mark.parametrize("model_type,variant", CASES, ids=lambda v: v or "default")
def test_rows_alone_and_packed_match_torch_from_either_checkpoint_format(
        tiny_checkpoints, model_type, variant):
    """Both formats load with every parameter filled and only the pooler left over, to the same
    parameters; ours equal torch's on padded rows and on packed rows (each row as alone)."""
    model, st_dir, bin_dir = tiny_checkpoints(model_type, variant)
    config, params, report, names = _load_with_report(st_dir)
    assert config.model_type == model_type and _settings(config) == _settings(model.config)
    assert not report.missing and report.loaded
    assert set(report.unused) == {n for n in names if n.startswith("pooler.")}
    bin_config, bin_params, bin_report, _ = _load_with_report(bin_dir)
    assert _settings(bin_config) == _settings(config) and bin_report == report
    jax.tree.map(np.testing.assert_array_equal, bin_params, params)
    parity.assert_padded_rows_match(model, config, params, PARITY_TOL)
    parity.assert_packed_rows_match(model, config, params, PARITY_TOL)


@pytest.mark.usefixtures("highest_matmul_precision")
@pytest.mark.parametrize("model_type", registry.MODEL_TYPES)
def test_a_checkpoint_with_heads_loads_its_encoder_and_reports_the_rest(tmp_path, model_type):
    """A masked-LM (T5: seq2seq) checkpoint: every parameter filled, the tensors of the modules
    beside the encoder (heads, a decoder) reported unused, ours equal to its encoder's states."""
    model = parity.tiny_torch_model(model_type, heads=True)
    model.save_pretrained(tmp_path)
    encoder = model.get_encoder() if model.config.is_encoder_decoder else model.base_model
    inside = {id(p) for p in encoder.parameters()}
    beside = {name for name, child in model.named_children() if child is not encoder
              and not {id(p) for p in child.parameters()} <= inside}
    config, params, report, _ = _load_with_report(tmp_path)
    assert not report.missing and report.unused
    assert {name.split(".")[0] for name in report.unused} <= beside, report.unused
    parity.assert_padded_rows_match(encoder, config, params, PARITY_TOL)


@pytest.mark.parametrize("family", [f for f in registry.families()
                                    if not f.capabilities.token_types], ids=lambda f: f.name)
def test_a_family_without_token_types_ignores_them(family):
    config = parity.tiny_config(family.model_types[0])
    module = registry.build_encoder(config)
    ids = jnp.asarray(parity.random_rows([6], config.vocab_size)[0])[None]
    params = module.init(jax.random.key(0), ids, jnp.ones_like(ids))
    np.testing.assert_array_equal(module.apply(params, ids, jnp.ones_like(ids), jnp.ones_like(ids)),
                                  module.apply(params, ids, jnp.ones_like(ids)))


@pytest.mark.parametrize("family", registry.families(), ids=lambda f: f.name)
def test_the_tiered_model_trains_end_to_end_at_tiny_size(tiny_config, tmp_path, family):
    """The saved encoder config is the unit's random one (``random_config``) for the run's
    tokenizer; the train steps' losses are finite and their gradients nonzero."""
    config = tiny_config()
    config.train.num_epochs = 1
    config.data.protocol = "dev_all"  # no selection split: one eval step to compile, not two
    config.model.random_encoder.model_type = family.model_types[0]
    config.model.tokenizer = f"word_level:{family.tokenizer.name}"
    train.train_and_evaluate(config, str(tmp_path))
    saved = json.loads((tmp_path / "encoder_config.json").read_text())
    expected = builders.random_encoder_config(typed(config).model,
                                              checkpoints.load_tokenizer(str(tmp_path)))
    assert saved["model_type"] == family.model_types[0]
    assert _settings(builders.encoder_config_from_dict(saved)) == _settings(expected)
    log = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["split"] == "train"]
    assert [r["step"] for r in steps] == [2, 4]
    assert all(np.isfinite(r["loss/total"]) and r["grad_norm"] > 0 for r in steps)


@pytest.mark.parametrize("family", registry.families(), ids=lambda f: f.name)
def test_a_family_s_config_names_an_encoder_it_publishes_and_stops_in_one_line_uncached(
        family, tmp_path, data_dir, main_install):
    """configs/<unit>.py's hub encoder is one of the unit's ``published``; without a cache or
    network main stops with one error line naming it (a PyPI copy's line: test_mpnet)."""
    encoder = importlib.import_module(f"configs.{family.name}").get_config().model.encoder
    assert encoder in family.published
    if encoder in pypi_copies.COPIES:
        return
    env = main_install({**os.environ, "HF_HOME": str(tmp_path / "hf_empty"),
                        "TRIP_DATA_DIR": data_dir, "PYTHONPATH": str(REPO)})
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-m", "trip_jax.main",
                             f"--config=configs/{family.name}.py", f"--workdir={tmp_path / 'w'}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and f"could not load {encoder!r}" in errors[0]
    assert "Traceback" not in result.stderr
