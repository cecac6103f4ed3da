"""Heads and detector on real cells only (``TieredConfig.cells = "real"``) against the grid.

Batches of two real dev pairs and one padding pair, with a padding entity slot, in the
packed_tokens and the dense layout; ``track_index`` from ``packing.track_index``. With the same
parameters, cells="real" must give the grid's outputs and loss for every option that changes the path.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from trip_jax.data import features, layouts, readers
from trip_jax.data.batching import BatchPlan
from trip_jax.data.layouts import packing
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.training.losses import LossConfig, tiered_loss
from trip_jax.models.cells import RealCells
from trip_jax.models.tiered import TieredConfig, build_tiered_model
from trip_jax.reference.grid_cells import GridCells

S = 7
TINY = TieredConfig(embedding_projection=16, state_projection=16, detector_layers=2,
                    detector_heads=4, detector_ff=64)
OPTIONS = {
    "default": {},
    "encoded_unmasked": dict(padding_rows="encoded", detector_padding_mask=False),
}
FLOAT_KEYS = ("pre_logits", "eff_logits", "conflict_logits", "conflict_prob", "story_logits")
PRED_KEYS = ("pre_pred", "eff_pred", "story_pred")
COMMON = dict(max_sentences=S, max_length=None, token_types="segments", entity_padding="bucket")
LAYOUTS = {"packed_tokens": layouts.PackedTokens(pack_length=64, max_shapes=1, dedup_rows=False,
                                                 **COMMON),
           "dense": layouts.Dense(seq_len=None, buckets=features.Buckets(8, 4, 8), **COMMON)}


@pytest.fixture(scope="module")
def encoded(data_dir):
    pairs = readers.read_pairs(os.path.join(data_dir, "dev.cgli.jsonl"))[:2]
    tokenizer = load_tokenizer("word_level:bert", texts=features.vocabulary_texts(pairs))
    return features.encode_pairs(pairs, tokenizer, max_sentences=S), len(tokenizer)


def make_model(vocab_size: int, **options):
    """A 2-layer, 32-wide random BERT encoder under the tiny heads and detector."""
    return build_tiered_model(transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64), dataclasses.replace(TINY, **options),
        max_sentences=S)


def make_batch(encoded_pairs, layout: str, spare_tracks: int = 0):
    """The two pairs, a padding pair and one padding entity slot. Both layouts have B*2*E*S
    encoder rows (packed_tokens: mostly padding rows); the model runs the detector on
    ``track_index`` with ``spare_tracks`` padding entries."""
    num_entities = max(p.num_entities for p in encoded_pairs) + 1
    sizes = ({"R": 3 * 2 * num_entities * S} if layout == "packed_tokens"
             else {"T": features.max_row_length(encoded_pairs)})
    batch = LAYOUTS[layout].build([*encoded_pairs, None],
                                  BatchPlan(np.asarray([0, 1, -1], np.int32), num_entities, sizes),
                                  encoded_pairs[0].pad_id)
    real_tracks = packing.track_index(batch["row_mask"]).size
    batch["track_index"] = packing.track_index(batch["row_mask"], real_tracks + spare_tracks)
    return batch


@pytest.fixture(scope="module")
def batches(encoded):
    pairs, _ = encoded
    # The dense batch's track_index has 3 padding entries past the real tracks.
    return {"packed_tokens": make_batch(pairs, "packed_tokens"),
            "dense": make_batch(pairs, "dense", 3)}


def random_params(model, batch):
    """Random parameters of ``model`` drawn with numpy (no init to compile): LayerNorm scales
    near 1, every other array normal with standard deviation 0.2."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]

    def draw(path, leaf):
        values = rng.normal(0.0, 0.2, leaf.shape)
        if getattr(path[-1], "key", None) == "scale":
            values = values + 1.0
        return jnp.asarray(values, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def params(encoded, batches):
    """Parameters of the tiny model (every option builds the same ones)."""
    return random_params(make_model(encoded[1]), batches["packed_tokens"])


def test_batches_have_every_kind_of_padding(batches):
    packed = batches["packed_tokens"]
    row_mask = packed["row_mask"]
    cells, tracks = row_mask.size, row_mask.size // S
    assert (packed["row_index"] == cells).any()                     # padding encoder rows
    real_tracks = row_mask.any(-1)
    assert (real_tracks & ~row_mask.all(-1)).any()                   # padding cells in real tracks
    assert (~real_tracks[:2]).any() and not real_tracks[2].any()    # padding tracks and pair
    np.testing.assert_array_equal(batches["dense"]["row_index"], np.arange(cells))
    np.testing.assert_array_equal(packed["track_index"], np.flatnonzero(real_tracks))
    spare = batches["dense"]["track_index"]
    assert spare.size == packed["track_index"].size + 3 and (spare[-3:] == tracks).all()


@pytest.mark.parametrize("layout", ["packed_tokens", "dense"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_real_cells_equal_the_grid(encoded, batches, params, layout, option):
    batch = batches[layout]
    p = {"params": params}
    grid = make_model(encoded[1], **OPTIONS[option]).apply(p, batch)
    real = make_model(encoded[1], cells="real", **OPTIONS[option]).apply(p, batch)
    assert set(real) == set(grid)
    for key in FLOAT_KEYS:
        assert real[key].shape == grid[key].shape and real[key].dtype == grid[key].dtype, key
        np.testing.assert_allclose(real[key], grid[key], rtol=0, atol=1e-5, err_msg=key)
    for key in PRED_KEYS:
        np.testing.assert_array_equal(real[key], grid[key], err_msg=key)
    # The comparison is not vacuous: tracks differ, and padding cells hold real numbers.
    assert np.ptp(np.asarray(grid["conflict_logits"])[batch["row_mask"]]) > 1e-3
    for mask_padding in (True, False):
        config = LossConfig(0.3, 0.3, 0.2, 0.2, mask_padding_in_losses=mask_padding)
        np.testing.assert_allclose(tiered_loss(real, batch, config)[0],
                                   tiered_loss(grid, batch, config)[0], rtol=0, atol=1e-5)


def test_heads_and_detector_see_only_real_rows_and_tracks(encoded, batches, params):
    """The heads run on R + 1 rows and the detector on K + 1 tracks, never on the grid."""
    batch = batches["packed_tokens"]
    model = make_model(encoded[1], cells="real")
    _, state = model.apply({"params": params}, batch,
                           capture_intermediates=True, mutable=["intermediates"])
    calls = state["intermediates"]
    pre, eff = calls["state_heads"]["__call__"][0]
    assert pre.shape[0] == eff.shape[0] == batch["row_index"].size + 1
    assert calls["detector"]["__call__"][0].shape == (batch["track_index"].size + 1, S)
    assert batch["track_index"].size + 1 < batch["row_mask"].size // S


def test_training_and_parameters(encoded, batches, params):
    batch = batches["packed_tokens"]
    real = make_model(encoded[1], cells="real")
    grid = make_model(encoded[1])
    # Same module names and shapes: checkpoints interchange.
    shapes = lambda model: jax.tree_util.tree_map(
        lambda leaf: leaf.shape, jax.eval_shape(model.init, jax.random.key(0), batch)["params"])
    assert shapes(real) == shapes(grid) == jax.tree_util.tree_map(jnp.shape, params)

    @jax.jit
    def grad(p, weights, key):
        def loss(p):
            out = real.apply({"params": p}, batch, deterministic=False, rngs={"dropout": key})
            return tiered_loss(out, batch, LossConfig(*weights))[0], out
        return jax.value_and_grad(loss, has_aux=True)(p)

    (value, out), grads = grad(params, jnp.array([0.3, 0.3, 0.2, 0.2]), jax.random.key(1))
    leaves = jax.tree_util.tree_leaves(grads)
    assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    for name in ("encoder", "state_heads", "detector", "embedding_proj", "states_proj"):
        assert any(np.asarray(g).any() for g in jax.tree_util.tree_leaves(grads[name])), name
    # Dropout is live: the training logits differ from the deterministic ones.
    evaluated = real.apply({"params": params}, batch)
    assert not np.allclose(out["pre_logits"], evaluated["pre_logits"])
    assert not np.asarray(out["conflict_prob"])[~batch["row_mask"]].any()
    # The conflict loss still reaches no state head (the state logits are gradient-free).
    _, conflict_only = grad(params, jnp.array([0.0, 0.0, 1.0, 0.0]), jax.random.key(1))
    assert not any(np.asarray(g).any()
                   for g in jax.tree_util.tree_leaves(conflict_only["state_heads"]))


def test_without_track_index_every_track_runs(encoded, batches, params):
    batch = batches["packed_tokens"]
    p = {"params": params}
    named = make_model(encoded[1], cells="real").apply(p, batch)
    every = make_model(encoded[1], cells="real").apply(
        p, {k: v for k, v in batch.items() if k != "track_index"})
    for key in FLOAT_KEYS:
        np.testing.assert_allclose(every[key], named[key], rtol=0, atol=1e-5, err_msg=key)
    with pytest.raises(ValueError, match="cells"):
        TieredConfig(cells="all")


def test_track_index_lists_tracks_with_a_real_row():
    row_mask = np.zeros((2, 2, 3, 4), bool)   # B=2, E=3, S=4: 12 tracks
    row_mask[0, 0, 0, :3] = True               # track 0
    row_mask[0, 1, 2, 0] = True                # track 5
    row_mask[1, 1, 1, :] = True                # track 10
    np.testing.assert_array_equal(packing.track_index(row_mask), [0, 5, 10])
    padded = packing.track_index(row_mask, num_tracks=5)
    assert padded.dtype == np.int32
    np.testing.assert_array_equal(padded, [0, 5, 10, 12, 12])
    with pytest.raises(ValueError, match="3 real tracks"):
        packing.track_index(row_mask, num_tracks=2)
    assert packing.track_index(np.zeros((1, 2, 2, 4), bool), 2).tolist() == [4, 4]
    assert packing.track_index(np.zeros((1, 2, 2, 4), bool)).size == 0


def test_cell_views_place_rows_and_padding_on_the_grid_and_tracks():
    row_mask = np.zeros((1, 2, 2, 3), bool)   # B=1, E=2, S=3: 4 tracks, 12 cells
    row_mask[0, 0, 0, :2] = True               # cells 0, 1 (track 0)
    row_mask[0, 1, 1, 0] = True                # cell 9 (track 3)
    # Three real rows, a dense-style row on a padding cell (2) and a padding row (12).
    row_index = jnp.asarray([0, 1, 9, 2, 12], jnp.int32)
    rows = jnp.arange(1.0, 6.0)[:, None] * jnp.ones((5, 2))
    padding = jnp.asarray([-1.0, -2.0])
    batch = {"row_mask": row_mask, "track_index": np.asarray([0, 3, 4], np.int32)}
    grid = GridCells.over(batch, row_index)
    real = RealCells.over(batch, row_index)
    expected = np.tile(np.asarray(padding), (12, 1))
    expected[[0, 1, 9]] = [[1, 1], [2, 2], [3, 3]]
    np.testing.assert_array_equal(grid.gather(rows, padding), expected)
    h = real.gather(rows, padding)             # the rows, off-cell ones padded, + padding row
    np.testing.assert_array_equal(h, [[1, 1], [2, 2], [3, 3], [-1, -2], [-1, -2], [-1, -2]])
    np.testing.assert_array_equal(real.to_grid(h).reshape(12, 2), expected)
    np.testing.assert_array_equal(grid.gather(rows, None),
                                  expected * row_mask.reshape(12, 1))
    # Tracks 0 and 3, track index 4 (past the end: dropped later), then the padding track.
    np.testing.assert_array_equal(real.track_mask, [[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(real.tracks(h)[:2], expected.reshape(4, 3, 2)[[0, 3]])
    np.testing.assert_array_equal(real.tracks(h)[-1], np.tile(padding, (3, 1)))
    np.testing.assert_array_equal(grid.tracks(grid.gather(rows, padding)),
                                  expected.reshape(4, 3, 2))
    track_values = jnp.asarray([[1.0] * 3, [2.0] * 3, [7.0] * 3, [9.0] * 3])
    np.testing.assert_array_equal(real.from_tracks(track_values).reshape(4, 3)[:, 0],
                                  [1, 9, 9, 2])
