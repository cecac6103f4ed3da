"""Tests of the tiered model on a tiny config: shapes, masking, layouts, heads, stop-gradient.

Batches come from the layouts (``trip_jax.data.layouts``) on two small hand-made pairs: the
packed_tokens batch has R = 48 encoder rows (with padding rows), as many as the dense one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from configs import base
from trip_jax.config.messages import ConfigError
from trip_jax.config.sections import ModelConfig
from trip_jax.config.typed import typed
from trip_jax.data import schema
from trip_jax.data import features, input_pipeline, layouts
from trip_jax.data.batching import BatchPlan, Epoch
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair
from trip_jax.training.losses import LossConfig, tiered_loss
from trip_jax.models.tiered import (NEG_LOGIT, StateHeads, TieredConfig, TieredModel,
                                    build_tiered_model, class_mask, real_logit_columns)

S = 4       # sentences per story (tiny)
E = 3       # entities per story in the batch
ROWS = 48   # encoder rows of every batch: B*2*E*S for the dense layout
COMMON = dict(max_sentences=S, max_length=None, token_types="segments", entity_padding="bucket")
LAYOUTS = {"packed_tokens": layouts.PackedTokens(pack_length=32, max_shapes=1, dedup_rows=False,
                                                 **COMMON),
           "dense": layouts.Dense(seq_len=None, buckets=features.Buckets(8, 4, 8), **COMMON)}
TINY = TieredConfig(embedding_projection=16, state_projection=16, detector_layers=2,
                    detector_heads=4, detector_ff=64)
WEIGHTS = LossConfig(0.3, 0.3, 0.2, 0.2)


def make_model(config: TieredConfig = TINY, max_sentences: int = S) -> TieredModel:
    """The tiny tiered model used by every test: a 2-layer, 32-wide random BERT encoder."""
    return build_tiered_model(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32), config, max_sentences=max_sentences)


def forward(model: TieredModel, params, batch):
    """Deterministic forward pass (eager: cheaper than compiling each shape for tiny models)."""
    return model.apply({"params": params}, batch)


def story_pairs(seed: int) -> list[StoryPair]:
    """Two small typed pairs (stories of 2-3 entities x 3-4 sentences) with random states."""
    rng = np.random.default_rng(seed)
    sentences = ("Ann took the cup.", "Ann dropped the cup.", "The cup broke.", "Ann ate bread.")

    def story(story_id, n_ent, n_sent, plausible):
        states = rng.integers(0, 3, size=(n_ent, n_sent, 2, 20)).astype(np.int32)
        return Story(story_id, sentences[:n_sent], ("Ann", "cup", "bread")[:n_ent], states,
                     plausible, () if plausible else ((1, 2),))

    return [StoryPair("p0", (story("a", 2, 4, True), story("b", 3, 3, False)), label=0),
            StoryPair("p1", (story("c", 3, 4, False), story("d", 2, 3, True)), label=1)]


@pytest.fixture(scope="module")
def encoded():
    pairs = story_pairs(0)
    tokenizer = load_tokenizer("word_level:bert", texts=features.vocabulary_texts(pairs))
    assert len(tokenizer) <= 64
    return features.encode_pairs(pairs, tokenizer, max_sentences=S)


def make_batch(encoded, layout: str, *, num_entities: int = E, pad_pairs: int = 0):
    """Batch arrays of the encoded pairs plus ``pad_pairs`` padding pairs (packed_tokens: R =
    ROWS rows; dense: rows as long as the longest)."""
    pairs = list(encoded) + [None] * pad_pairs
    index = np.asarray(list(range(len(encoded))) + [-1] * pad_pairs, np.int32)
    sizes = {"R": ROWS} if layout == "packed_tokens" else {
        "T": features.max_row_length(encoded)}
    return LAYOUTS[layout].build(pairs, BatchPlan(index, num_entities, sizes),
                                 encoded[0].pad_id)


@pytest.fixture(scope="module")
def packed(encoded):
    return make_batch(encoded, "packed_tokens")


@pytest.fixture(scope="module")
def params(packed):
    return make_model().init(jax.random.key(0), packed)["params"]


@pytest.fixture(scope="module")
def outputs(params, packed):
    return forward(make_model(), params, packed)


def test_output_shapes_and_dtypes(outputs):
    B = 2
    expected = {
        "pre_logits": ((B, 2, E, S, 20, 9), jnp.float32),
        "eff_logits": ((B, 2, E, S, 20, 9), jnp.float32),
        "pre_pred": ((B, 2, E, S, 20), jnp.int32),
        "eff_pred": ((B, 2, E, S, 20), jnp.int32),
        "conflict_logits": ((B, 2, E, S), jnp.float32),
        "conflict_prob": ((B, 2, E, S), jnp.float32),
        "story_logits": ((B, 2), jnp.float32),
        "story_pred": ((B,), jnp.int32),
    }
    assert set(outputs) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert outputs[key].shape == shape, key
        assert outputs[key].dtype == dtype, key


def test_padding_rows_are_zero_and_story_choice_follows_beliefs(outputs, packed):
    pad = ~packed["row_mask"]
    assert pad.any() and (~pad).any()
    assert (packed["row_index"] == packed["row_mask"].size).any()  # has padding encoder rows
    assert not np.asarray(outputs["pre_pred"])[pad].any()
    assert not np.asarray(outputs["eff_pred"])[pad].any()
    assert np.asarray(outputs["pre_pred"])[~pad].any()
    prob = np.asarray(outputs["conflict_prob"])
    assert not prob[pad].any()
    assert (prob[~pad] > 0).all() and (prob[~pad] < 1).all()
    score = -prob.sum(axis=(2, 3)) / 2
    np.testing.assert_allclose(outputs["story_logits"], score, rtol=1e-6)
    np.testing.assert_array_equal(outputs["story_pred"], score.argmax(-1))


def test_logits_of_missing_classes_are_masked(outputs):
    invalid = ~class_mask(schema.NUM_CLASSES)
    assert invalid.sum() == 20 * 9 - 66
    assert (np.asarray(outputs["pre_logits"])[..., invalid] == NEG_LOGIT).all()
    assert (np.asarray(outputs["eff_logits"])[..., invalid] == NEG_LOGIT).all()
    assert (np.asarray(outputs["pre_pred"]) < np.asarray(schema.NUM_CLASSES)).all()


@pytest.mark.parametrize("padding_mask", [True, False])
def test_packed_and_dense_layouts_agree(encoded, packed, params, padding_mask):
    # The detector's padding mask changes no parameter shapes: the same params serve both.
    model = make_model(dataclasses.replace(TINY, detector_padding_mask=padding_mask))
    dense = make_batch(encoded, "dense")
    assert (dense["row_index"] == np.arange(ROWS)).all() and not dense["row_mask"].all()
    out_packed, out_dense = forward(model, params, packed), forward(model, params, dense)
    for key in out_packed:
        np.testing.assert_allclose(out_packed[key], out_dense[key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    np.testing.assert_allclose(tiered_loss(out_packed, packed, WEIGHTS)[0],
                               tiered_loss(out_dense, dense, WEIGHTS)[0], rtol=1e-5)


@pytest.mark.parametrize("padding_rows", ["zero", "encoded"])
@pytest.mark.parametrize("layout", ["packed_tokens", "dense"])
def test_a_batch_in_pieces_reads_each_pieces_rows_from_its_own_sequences(encoded, layout,
                                                                       padding_rows):
    # The steps pass their mesh's batch shards as ``pieces`` (a sharded batch then reads its rows
    # on its own devices; the original's padding row is encoded once a piece): every layout
    # builds a batch in pieces whose rows start in their own piece's sequences, and the outputs
    # equal the whole batch's.
    batch = next(LAYOUTS[layout].batches(encoded, Epoch(2, shards_per_process=2)))
    assert input_pipeline.rows_outside_their_piece(batch, 2) == 0
    model = make_model(dataclasses.replace(TINY, padding_rows=padding_rows))
    params = model.init(jax.random.key(0), batch)["params"]
    whole = forward(model, params, batch)
    in_pieces = model.apply({"params": params}, batch, pieces=2)
    for key in whole:
        np.testing.assert_allclose(in_pieces[key], whole[key], rtol=1e-6, atol=1e-6,
                                   err_msg=key)


def test_padding_entities_and_pairs_change_neither_outputs_nor_loss(encoded, packed, params,
                                                                    outputs):
    padded = make_batch(encoded, "packed_tokens", num_entities=E + 1, pad_pairs=1)
    out_padded = forward(make_model(), params, padded)
    for key in ("pre_logits", "pre_pred", "eff_pred", "conflict_prob"):
        np.testing.assert_allclose(out_padded[key][:2, :, :E], outputs[key],
                                   rtol=1e-5, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(out_padded["story_logits"][:2], outputs["story_logits"], rtol=1e-5)
    parts = tiered_loss(outputs, packed, WEIGHTS)[1]
    parts_padded = tiered_loss(out_padded, padded, WEIGHTS)[1]
    for key in parts:
        np.testing.assert_allclose(parts_padded[key], parts[key], rtol=1e-5, err_msg=key)


def test_jitted_training_step_and_stop_gradient(params, packed):
    """Under jit with dropout on, the conflict loss reaches no state head parameter."""
    model = make_model()

    # -O0: XLA:CPU's LLVM optimisations dominate this one program's compile time.
    @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    def grad(p, weights, key):
        def loss(p):
            out = model.apply({"params": p}, packed, deterministic=False, rngs={"dropout": key})
            return tiered_loss(out, packed, LossConfig(*weights))[0], out
        return jax.grad(loss, has_aux=True)(p)

    conflict_only, out_a = grad(params, jnp.array([0.0, 0.0, 1.0, 0.0]), jax.random.key(4))
    heads = jax.tree_util.tree_leaves(conflict_only["state_heads"])
    assert heads and all(not np.asarray(g).any() for g in heads)
    # The same loss does train the detector, its projections and the encoder...
    for name in ("detector", "states_proj", "embedding_proj", "encoder"):
        assert any(np.asarray(g).any() for g in jax.tree_util.tree_leaves(conflict_only[name]))
    # ...and the state losses do reach the heads.
    states_only, out_b = grad(params, jnp.array([1.0, 1.0, 0.0, 0.0]), jax.random.key(5))
    assert all(np.asarray(g).any() for g in jax.tree_util.tree_leaves(states_only["state_heads"]))
    # Dropout is live (other key, other logits) and padding stays masked.
    assert np.isfinite(np.asarray(out_a["conflict_prob"])).all()
    assert not np.allclose(out_a["pre_logits"], out_b["pre_logits"])
    assert not np.asarray(out_a["conflict_prob"])[~packed["row_mask"]].any()
    assert not np.asarray(out_a["pre_pred"])[~packed["row_mask"]].any()


def dot_precisions(jaxpr) -> list:
    """The ``precision`` of every dot_general of ``jaxpr``, into every nested jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    found += dot_precisions(sub)
    return found


@pytest.mark.parametrize("name", ["default", "high", "highest"])
def test_every_matmul_forward_and_backward_runs_at_the_configured_precision(params, packed,
                                                                           name):
    config = dataclasses.replace(TINY, padding_rows="encoded")  # the padding row's pass too
    model = build_tiered_model(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32), config, max_sentences=S,
        matmul_precision=name)

    def loss(p):
        return tiered_loss(model.apply({"params": p}, packed), packed, WEIGHTS)[0]

    precisions = dot_precisions(jax.make_jaxpr(jax.grad(loss))(params))
    want = (jax.lax.Precision(name),) * 2
    assert len(precisions) > 20 and set(precisions) == {want}
    with pytest.raises(ValueError, match="model.matmul_precision: unknown value"):
        ModelConfig(matmul_precision="tensorfloat32")  # checked once, by the schema


@pytest.fixture(scope="module")
def heads_and_input():
    heads = StateHeads(TINY)
    h = jax.random.normal(jax.random.key(2), (ROWS, 32))
    return heads, heads.init(jax.random.key(3), h)["params"], h


def test_parameters_are_stacked_on_one_axis(heads_and_input, params):
    _, p, _ = heads_and_input
    shapes = jax.tree_util.tree_map(lambda x: x.shape, p)
    assert shapes == {"heads": {"dense": {"kernel": (40, 32, 32), "bias": (40, 32)},
                                "out_proj": {"kernel": (40, 32, 9), "bias": (40, 9)}}}
    assert jax.tree_util.tree_map(lambda x: x.shape, params["state_heads"]) == shapes


def test_vmapped_heads_equal_a_per_attribute_loop(heads_and_input):
    heads, p, h = heads_and_input
    pre, eff = heads.apply({"params": p}, h)
    assert pre.shape == eff.shape == (ROWS, 20, 9)
    stacked = jax.tree_util.tree_map(np.asarray, p["heads"])
    h = np.asarray(h)
    for side, logits in enumerate((pre, eff)):
        for a, n_a in enumerate(schema.NUM_CLASSES):
            k = side * 20 + a
            hidden = np.tanh(h @ stacked["dense"]["kernel"][k] + stacked["dense"]["bias"][k])
            expected = hidden @ stacked["out_proj"]["kernel"][k] + stacked["out_proj"]["bias"][k]
            np.testing.assert_allclose(logits[:, a, :n_a], expected[:, :n_a],
                                       rtol=1e-5, atol=1e-5)


def test_masked_nine_class_head_equals_n_class_softmax(heads_and_input):
    heads, p, h = heads_and_input
    pre, _ = heads.apply({"params": p}, h)
    probs = np.asarray(jax.nn.softmax(pre, axis=-1))
    for a, n_a in enumerate(schema.NUM_CLASSES):
        small = np.asarray(jax.nn.softmax(pre[:, a, :n_a], axis=-1))
        np.testing.assert_allclose(probs[:, a, :n_a], small, rtol=1e-6, atol=1e-7)
        assert (probs[:, a, n_a:] == 0).all()
        np.testing.assert_array_equal(np.argmax(pre[:, a], -1), small.argmax(-1))


def test_each_head_draws_its_own_dropout_masks(heads_and_input):
    heads, p, h = heads_and_input
    same = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x[:1], x.shape), p)
    pre, eff = heads.apply({"params": same}, h, deterministic=False,
                           rngs={"dropout": jax.random.key(7)})
    assert not np.allclose(pre[:, 6], pre[:, 7])    # two 3-class heads, identical parameters
    assert not np.allclose(pre[:, 6], eff[:, 6])
    pre_eval, eff_eval = heads.apply({"params": same}, h)
    np.testing.assert_array_equal(pre_eval[:, 6], pre_eval[:, 7])
    np.testing.assert_array_equal(pre_eval[:, 6], eff_eval[:, 6])


def test_real_logit_columns_select_66_per_side():
    columns = real_logit_columns(schema.NUM_CLASSES)
    assert len(columns) == 66
    flat = np.arange(20 * 9).reshape(20, 9)
    assert list(columns[:3]) == [0, 1, 2]                  # h_location: 3 classes
    assert list(columns[15:24]) == list(flat[5])           # location: 9 classes


def test_config_checks():
    with pytest.raises(KeyError):
        TieredConfig.from_mapping({"detector_layer": 2})
    config = base.get_config()
    config.model.tiered.embedding_projection = 250
    with pytest.raises(ConfigError, match="a divisor of the detector width 506"):
        typed(config)  # a rule between keys: checked once, as the typed config is built
    assert TieredConfig().detector_d_model == 512
    assert TieredConfig.from_mapping({"detector_layers": 2}).detector_layers == 2


def test_sentence_count_must_match_config(packed, params):
    model = make_model(TINY, max_sentences=S + 1)
    with pytest.raises(ValueError, match="max_sentences"):
        model.apply({"params": params}, packed)
