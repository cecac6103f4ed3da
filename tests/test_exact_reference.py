"""The exact fidelity: one test per difference, then the whole step against PyTorch.

A tiny BERT (random weights, a word-level tokenizer built here, every dropout 0) and two small
pairs: the batch holds the first pair (stories of 2 and 3 entities, 4 and 3 sentences, S = 7);
the second has 4 entities, so padding to the data's largest entity count adds entity cells.
The PyTorch side is ``trip_jax/interop/torch_reference.py``, written from the reference
semantics.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import torch
import transformers

from trip_jax.config import sections
from trip_jax.config.messages import ConfigError
from trip_jax.interop import torch_reference as ref
from configs import base, bert, deberta, minilm, roberta, tiny
from trip_jax.data import batching, features, layouts, schema
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair
from trip_jax.training.losses import LossConfig, tiered_loss
from trip_jax.models.families.bert import BertEncoder
from trip_jax.models.families.deberta import DebertaEncoder
from trip_jax.models.tiered import TieredConfig, build_tiered_model
from trip_jax.reference.padding_row import LEGACY_MASK_BIAS
from trip_jax.training.optimizers import make_optimizer

S = 7
CUT = 16
# Exact fidelity's layouts: rows cut at CUT tokens, zero token types, E the data's largest.
EXACT_DATA = dict(max_sentences=S, max_length=CUT, token_types="zeros", entity_padding="data_max")
LAYOUTS = {"packed_tokens": layouts.PackedTokens(pack_length=64, max_shapes=4, dedup_rows=False,
                                                 **EXACT_DATA),
           "dense": layouts.Dense(seq_len=CUT, buckets=features.Buckets(8, 4, 8), **EXACT_DATA)}
LR = 1e-3
HF_CONFIG = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
EXACT = TieredConfig(embedding_projection=16, state_projection=16,
                     detector_layers=2, detector_heads=4, detector_ff=64, head_dropout=0.0,
                     projection_dropout=0.0, detector_input_dropout=0.0, detector_dropout=0.0,
                     conflict_dropout=0.0, detector_padding_mask=False, padding_rows="encoded")
WEIGHTS = LossConfig(0.4, 0.4, 0.1, 0.1, mask_padding_in_losses=False)  # Table 2 "all"
# Exact fidelity's matmul precision ("highest"), for the model; the encoder called alone and the
# other JAX code here compute at it too (conftest), so parity holds on a GPU as on a CPU.
PRECISION = base.FIDELITIES["exact"]["model.matmul_precision"]
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


def hf_config():
    return transformers.BertConfig(**HF_CONFIG)


def exact_model(config: TieredConfig = EXACT):
    """The tiered model of ``config`` around the tiny BERT, at exact fidelity's precision."""
    return build_tiered_model(hf_config(), config, max_sentences=S, matmul_precision=PRECISION)


def story_pairs() -> list[StoryPair]:
    """Two pairs; the first has a row longer than 16 tokens, the second 4 entities."""
    rng = np.random.default_rng(0)
    sentences = ("Ann took the cup from the kitchen table and walked slowly over to the sink.",
                 "Ann dropped the cup.", "The cup broke.", "Ann ate bread.")
    entities = ("Ann", "cup", "bread", "table")

    def story(story_id, n_ent, n_sent, plausible):
        states = rng.integers(0, 3, size=(n_ent, n_sent, 2, 20)).astype(np.int32)
        return Story(story_id, sentences[:n_sent], entities[:n_ent], states, plausible,
                     () if plausible else ((1, 2),))

    return [StoryPair("p0", (story("a", 2, 4, True), story("b", 3, 3, False)), label=0),
            StoryPair("p1", (story("c", 4, 3, False), story("d", 2, 3, True)), label=1)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("word_level:bert", texts=features.vocabulary_texts(story_pairs()))


@pytest.fixture(scope="module")
def encoded(tokenizer):
    return features.encode_pairs(story_pairs(), tokenizer, max_sentences=S, max_length=CUT,
                                 token_types="zeros")


def one_batch(encoded, layout: str) -> dict[str, np.ndarray]:
    """The first pair, entities padded to the data's largest count (dense: T = 16)."""
    layout = dataclasses.replace(LAYOUTS[layout], num_entities=features.max_entities(encoded))
    (batch,) = layout.batches(encoded[:1], batching.Epoch(1))
    return batch


@pytest.fixture(scope="module")
def packed(encoded):
    return one_batch(encoded, "packed_tokens")


@pytest.fixture(scope="module")
def model():
    return exact_model()


@pytest.fixture(scope="module")
def params(model, packed):
    # Random values in the model's shapes (no compiled init): LayerNorm scales near 1, every
    # other parameter ~N(0, 0.1), so that no bias is zero and no scale is exactly 1.
    shapes = jax.eval_shape(model.init, jax.random.key(0), packed)["params"]
    rng = np.random.default_rng(1)

    def draw(path, leaf):
        noise = rng.normal(0.0, 0.1, leaf.shape).astype(np.float32)
        return jnp.asarray(noise + (1.0 if path[-1].key == "scale" else 0.0))

    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def torch_model(params):
    torch.manual_seed(0)
    model = ref.ReferenceModel(hf_config(), ref.ReferenceConfig.from_tiered(EXACT, S))
    ref.load_jax_params(model, params)
    return model.eval()


# ------------------------------------------------------------------------------------------
# One test per difference.

def padding_vector(config: TieredConfig, params, batch) -> jax.Array:
    """The padding-row vector the model of ``config`` encodes along with ``batch``."""
    return exact_model(config).apply({"params": params}, batch, method="row_embeddings")[2]


# Dense rows are 16 tokens: a 24-token padding row widens the batch's sequences.
@pytest.mark.parametrize("layout, length", [("packed_tokens", 16), ("dense", 16), ("dense", 24)])
def test_padding_row_vector_is_the_encoder_output_on_an_all_zero_masked_row(
        params, encoded, torch_model, layout, length):
    batch = one_batch(encoded, layout)
    config = dataclasses.replace(EXACT, padding_row_length=length)
    zeros = jnp.zeros((1, length), jnp.int32)
    encoder = BertEncoder(hf_config())
    alone = lambda mask, **kwargs: encoder.apply({"params": params["encoder"]}, zeros, mask,
                                                 zeros, **kwargs)[0, 0]
    # Encoded with the batch, the row attends as alone: equal up to how each program sums.
    vector = padding_vector(config, params, batch)
    np.testing.assert_allclose(vector, alone(zeros, mask_bias=LEGACY_MASK_BIAS), rtol=0,
                               atol=1e-6)
    uniform = alone(zeros)
    masked = dataclasses.replace(config, padding_row_attention="masked")
    np.testing.assert_allclose(padding_vector(masked, params, batch), uniform, rtol=0, atol=1e-6)
    if length == 16:
        with torch.no_grad():  # the original's encoder and mask (transformers 4.11: -10000)
            np.testing.assert_allclose(vector, torch_model.padding_row().numpy(), atol=1e-5)
    # Under -10000 a fully masked row attends like an unmasked one (up to score rounding),
    # unlike the float32-minimum mask of today's transformers (uniform attention).
    to_unmasked = np.abs(np.asarray(vector - alone(jnp.ones_like(zeros)))).max()
    assert to_unmasked < 0.1 * np.abs(np.asarray(vector - uniform)).max()


def test_deberta_encodes_its_masked_padding_row_with_the_batch(packed):
    deberta_config = transformers.DebertaConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, relative_attention=True,
        pos_att_type=["c2p", "p2c"], position_biased_input=False, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    config = dataclasses.replace(EXACT, padding_row_attention="masked")
    model = build_tiered_model(deberta_config, config, max_sentences=S,
                               matmul_precision=PRECISION)
    params = model.init(jax.random.key(0), packed)["params"]
    rows, _, vector = model.apply({"params": params}, packed, method="row_embeddings")
    zeros = jnp.zeros((1, config.padding_row_length), jnp.int32)
    alone = DebertaEncoder(deberta_config).apply({"params": params["encoder"]}, zeros, zeros,
                                                  zeros)[0, 0]
    np.testing.assert_allclose(vector, alone, rtol=0, atol=1e-6)
    # The batch's rows are encoded as without the padding row.
    clean = build_tiered_model(deberta_config, dataclasses.replace(config, padding_rows="zero"),
                               max_sentences=S, matmul_precision=PRECISION)
    without, _, none = clean.apply({"params": params}, packed, method="row_embeddings")
    assert none is None
    np.testing.assert_allclose(rows, without, rtol=0, atol=1e-6)
    # transformers 4.11's -10000 mask is BERT's and RoBERTa's only: refused as the model is built.
    with pytest.raises(ValueError, match="use 'masked' for DebertaEncoder"):
        build_tiered_model(deberta_config, EXACT, max_sentences=S, matmul_precision=PRECISION)


def test_padding_cells_get_the_padding_row_vector(model, params, packed):
    out = jax.jit(model.apply)({"params": params}, packed)
    clean = exact_model(dataclasses.replace(EXACT, padding_rows="zero"))
    zero_out = jax.jit(clean.apply)({"params": params}, packed)
    pad = ~packed["row_mask"]
    logits = np.asarray(out["pre_logits"])[pad]
    assert pad.sum() > 0 and np.ptp(logits, axis=0).max() == 0  # one vector for every cell
    assert np.abs(logits[0] - np.asarray(zero_out["pre_logits"])[pad][0]).max() > 1e-3
    real = packed["row_mask"]
    # Two programs: equal up to how each compiles its sums.
    np.testing.assert_allclose(np.asarray(out["pre_logits"])[real],
                               np.asarray(zero_out["pre_logits"])[real], rtol=0, atol=1e-6)
    # With the detector unmasked, the padding cells of a real track move its conflict logits.
    assert np.abs(np.asarray(out["conflict_logits"])[real]
                  - np.asarray(zero_out["conflict_logits"])[real]).max() > 1e-4


def layer_scans(jaxpr) -> int:
    """The scan equations of ``jaxpr`` (each a stack of layers), into every nested jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == "scan"
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    total += layer_scans(sub)
    return total


def test_the_padding_row_costs_no_second_encoder_pass(model, params, packed):
    clean = exact_model(dataclasses.replace(EXACT, padding_rows="zero"))
    scans = {name: layer_scans(jax.make_jaxpr(m.apply)({"params": params}, packed))
             for name, m in (("encoded", model), ("zero", clean))}
    assert scans == {"encoded": 2, "zero": 2}  # the encoder's layers and the detector's


def test_token_types_are_all_zero_at_exact_fidelity(tokenizer, encoded, packed):
    assert not any(s.type_ids.any() for p in encoded for s in p.stories)
    assert not packed["token_type_ids"].any()
    segments = features.encode_pairs(story_pairs(), tokenizer, max_sentences=S)
    assert all(s.type_ids.any() for p in segments for s in p.stories)  # BERT: sentence = 1
    with pytest.raises(ConfigError, match="data.token_types"):  # refused once, by the schema
        sections.DataConfig(token_types="ones")


def test_entities_are_padded_to_the_data_maximum(encoded):
    assert features.max_entities(encoded) == 4
    assert features.max_entities(encoded[:1], encoded[1:]) == 4
    for layout in LAYOUTS.values():
        plans = dataclasses.replace(layout, num_entities=4).plan(encoded, batching.Epoch(1))
        assert [p.num_entities for p in plans] == [4, 4]
        with pytest.raises(ValueError, match="num_entities"):
            dataclasses.replace(layout, num_entities=3).plan(encoded, batching.Epoch(1))
    bucketed = LAYOUTS["dense"].plan(encoded[:1], batching.Epoch(1))
    assert bucketed[0].num_entities == 8  # the buckets start at 8


def test_the_16_token_cut_is_reported(tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger=features.logger.name):
        cut = features.encode_pairs(story_pairs(), tokenizer, max_sentences=S, max_length=CUT)
    uncut = features.encode_pairs(story_pairs(), tokenizer, max_sentences=S)
    report = features.truncation_report(uncut, CUT)
    assert report.cut_rows > 0 and report.longest > CUT
    assert f"max_length={CUT} cuts {report.cut_rows} of {report.rows} rows" in caplog.text
    assert features.max_row_length(cut) == CUT


def test_one_switch_sets_every_piece_and_the_defaults_per_config():
    for module in (roberta, bert, deberta):
        assert base.fidelity_of(module.get_config()) == "exact"
        assert base.fidelity_of(module.get_config("fidelity=clean")) == "clean"
        config = module.get_config("losses=all")  # losses alone keep the default fidelity
        assert base.fidelity_of(config) == "exact" and config.loss.story_weight == 0.1
    for module in (minilm, tiny):
        assert base.fidelity_of(module.get_config()) == "clean"
        config = module.get_config("losses=omit_states,fidelity=exact")
        assert base.fidelity_of(config) == "exact" and config.loss.pre_weight == 0.0
    exact = roberta.get_config()
    assert (exact.model.tiered.padding_rows, exact.model.tiered.detector_padding_mask,
            exact.loss.mask_padding_in_losses, exact.data.entity_padding, exact.data.token_types,
            exact.train.optimizer, exact.data.max_length) == (
        "encoded", False, False, "data_max", "zeros", "hf_adamw", 16)
    assert exact.model.matmul_precision == "highest" and exact.model.dtype == "float32"
    assert roberta.get_config("fidelity=clean").model.matmul_precision == "default"
    exact.data.token_types = "segments"  # one difference alone
    assert base.fidelity_of(exact) == "mixed"
    assert deberta.get_config().model.tiered.padding_row_attention == "masked"
    with pytest.raises(ValueError, match="names fidelity twice"):
        roberta.get_config("fidelity=exact,fidelity=clean")


# ------------------------------------------------------------------------------------------
# The whole step against the PyTorch reference.

def jax_step(model, params, batch):
    """Forward, the four losses, gradients and one hf_adamw step with clipping at 1.0."""
    train = ml_collections.ConfigDict(dict(
        optimizer="hf_adamw", learning_rate=LR, head_learning_rate=0.0, adam_b1=0.9,
        adam_b2=0.999, adam_eps=1e-6, weight_decay=0.0, grad_clip_norm=1.0,
        schedule="constant", warmup_fraction=0.1, freeze_encoder=False))
    tx, _ = make_optimizer(train, total_steps=1)

    @jax.jit
    def step(params):
        def loss_fn(p):
            outputs = model.apply({"params": p}, batch)
            loss, parts = tiered_loss(outputs, batch, WEIGHTS)
            return loss, (outputs, parts)

        (_, (outputs, parts)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return outputs, parts, optax.apply_updates(params, updates)

    return step(params)


@pytest.fixture(scope="module")
def both_steps(model, params, packed, encoded, torch_model):
    outputs, parts, new_params = jax_step(model, params, packed)
    dense = one_batch(encoded, "dense")
    inputs = ref.padded_inputs(dense, pad_id=encoded[0].pad_id, seq_len=CUT)
    optimizer = ref.ReferenceAdamW(torch_model.parameters(), lr=LR, eps=1e-6)
    weights = (WEIGHTS.pre_weight, WEIGHTS.eff_weight, WEIGHTS.conflict_weight,
               WEIGHTS.story_weight)
    torch_out = ref.train_step(torch_model, optimizer, lambda: torch_model.forward_padded(
        **inputs), ref.label_tensors(dense), weights)
    return outputs, parts, new_params, torch_out


def test_exact_forward_matches_the_pytorch_reference(both_steps, packed):
    outputs, parts, _, torch_out = both_steps
    got, want = torch_out["outputs"], torch_out["losses"]
    num_classes = schema.NUM_CLASSES
    for side in ("pre_logits", "eff_logits"):
        for a, n in enumerate(num_classes):  # every cell, padding cells included
            np.testing.assert_allclose(np.asarray(outputs[side])[..., a, :n],
                                       got[side][a].numpy(), atol=1e-4, rtol=1e-4)
    for key in ("conflict_logits", "conflict_prob", "story_logits"):
        np.testing.assert_allclose(outputs[key], got[key].numpy(), atol=1e-4, rtol=1e-4)
    for key in ("pre", "eff", "conflict", "story", "total"):
        np.testing.assert_allclose(parts[key], want[key].numpy(), atol=1e-4, rtol=1e-4)
    assert float(want["conflict"]) > 0 and float(want["story"]) > 0


def test_exact_optimizer_step_matches_the_pytorch_reference(both_steps, params, torch_model):
    _, _, new_params, _ = both_steps
    after = ref.torch_params_as_jax(torch_model, params)
    flat_new = jax.tree_util.tree_leaves_with_path(new_params)
    flat_ref = dict(jax.tree_util.tree_leaves_with_path(after))
    flat_old = dict(jax.tree_util.tree_leaves_with_path(params))
    moved = 0
    for path, value in flat_new:
        value, want, old = np.asarray(value), flat_ref[path], np.asarray(flat_old[path])
        scale = np.abs(want).max()
        assert np.abs(value - want).max() <= 1e-4 * scale, jax.tree_util.keystr(path)
        # The step itself (about lr per parameter), not only the parameters, agrees.
        assert np.abs((value - old) - (want - old)).max() <= 0.02 * LR, jax.tree_util.keystr(path)
        moved += int((np.abs(want - old) > 0.1 * LR).sum())
    assert moved > 1000


def test_real_rows_layout_of_the_reference_equals_the_padded_one(encoded, torch_model):
    dense = one_batch(encoded, "dense")
    with torch.no_grad():
        padded = torch_model.forward_padded(
            **ref.padded_inputs(dense, pad_id=encoded[0].pad_id, seq_len=CUT))
        rows = torch_model.forward_rows(**ref.row_inputs(dense))
    for key in ("conflict_logits", "conflict_prob", "story_logits"):
        np.testing.assert_allclose(rows[key].numpy(), padded[key].numpy(), atol=1e-5)
    for a in range(len(schema.NUM_CLASSES)):
        np.testing.assert_allclose(rows["pre_logits"][a].numpy(),
                                   padded["pre_logits"][a].numpy(), atol=1e-5)
