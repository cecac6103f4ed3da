"""The one name table (trip_jax/models/param_names.py): per-layer names <-> stacked layers, and
the whole tiered model's PyTorch names <-> Flax paths, both ways."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import traverse_util

from trip_jax.data import schema
from trip_jax.models import builders, param_names, weights
from trip_jax.models.tiered import TieredConfig, build_tiered_model, class_mask

BERT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=20)
TIERED = TieredConfig(embedding_projection=8, state_projection=8, detector_layers=2,
                      detector_heads=2, detector_ff=16)


def random_tree(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {p: rng.normal(size=s.shape).astype(np.float32) for p, s in shapes.items()}


def tiered_shapes():
    model = build_tiered_model(transformers.BertConfig(**BERT), TIERED, max_sentences=7)
    shapes = jax.eval_shape(lambda: builders.init_params(model, jax.random.key(0), 7))
    return traverse_util.flatten_dict(shapes)


def test_unstacked_names_are_hugging_faces_and_stacking_inverts():
    stacked = random_tree(weights.expected_params(transformers.BertConfig(**BERT)))
    query = ("encoder", "layer", "attention", "self", "query", "kernel")
    assert stacked[query].shape == (3, 16, 16)
    per_layer = param_names.unstack_layers(stacked)
    for i in range(3):
        np.testing.assert_array_equal(
            per_layer[("encoder", "layer", str(i), "attention", "self", "query", "kernel")],
            stacked[("encoder", "layer", "attention", "self", "query", "kernel")][i])
    assert ("encoder", "layer", "attention", "self", "query", "kernel") not in per_layer
    assert param_names.per_layer_paths(stacked) == []
    assert len(param_names.per_layer_paths(per_layer)) == 3 * 16  # 16 arrays per BERT layer
    back = param_names.stack_layers(per_layer)
    assert back.keys() == stacked.keys()
    for path, value in stacked.items():
        np.testing.assert_array_equal(back[path], value)


def test_detector_layers_are_layer_i_per_layer():
    flat = random_tree(tiered_shapes())
    per_layer = param_names.unstack_layers(flat)
    assert ("detector", "layer_1", "ff_in", "kernel") in per_layer
    assert ("detector", "layers", "ff_in", "kernel") not in per_layer
    assert param_names.layer_paths(("detector", "layers", "ff_in", "kernel"), 2) == [
        ("detector", "layer_0", "ff_in", "kernel"), ("detector", "layer_1", "ff_in", "kernel")]
    assert param_names.layer_paths(("detector", "conflict_out", "kernel"), 2) is None


def test_a_missing_layer_is_named():
    per_layer = {("encoder", "layer", "0", "x", "bias"): np.zeros(2),
                 ("encoder", "layer", "2", "x", "bias"): np.zeros(2)}
    with pytest.raises(ValueError, match=r"encoder/layer/x/bias: layers \[0, 2\] are not 0..1"):
        param_names.stack_layers(per_layer)


def test_tiered_model_round_trips_through_the_pytorch_names():
    shapes = tiered_shapes()
    flat = random_tree(shapes)
    # The columns a head lacks are not PyTorch parameters: zero here, as the table fills them.
    lacking = ~np.tile(class_mask(schema.NUM_CLASSES), (2, 1))
    for leaf, columns in (("kernel", lacking[:, None, :]), ("bias", lacking)):
        path = param_names.HEADS + ("out_proj", leaf)
        flat[path] = np.where(columns, 0.0, flat[path]).astype(np.float32)
    tensors = param_names.tiered_to_torch(flat, schema.NUM_CLASSES)
    assert tensors["detector.layers.1.self_attn.in_proj_weight"].shape == (48, 16)
    assert tensors["effect_classifiers.19.out_proj.weight"].shape == (3, 16)
    assert tensors["embedding.encoder.layer.2.output.LayerNorm.weight"].shape == (16,)
    assert "decoder.weight" in tensors
    back, unused = param_names.tiered_from_torch(tensors, shapes, schema.NUM_CLASSES)
    assert unused == []
    assert back.keys() == flat.keys()
    for path, value in flat.items():
        np.testing.assert_array_equal(back[path], value, err_msg="/".join(path))


def test_tensors_without_a_place_and_unfilled_parameters_are_reported():
    shapes = tiered_shapes()
    tensors = param_names.tiered_to_torch(random_tree(shapes), schema.NUM_CLASSES)
    tensors["detector.layers.2.linear1.weight"] = np.zeros((16, 16), np.float32)
    del tensors["detector.layers.1.norm2.bias"]
    back, unused = param_names.tiered_from_torch(tensors, shapes, schema.NUM_CLASSES)
    assert unused == ["detector.layers.2.linear1.weight"]
    assert ("detector", "layers", "ff_norm", "bias") not in back  # layer 1's is missing
    assert ("detector", "layers", "ff_norm", "scale") in back
    tensors["effect_classifiers.3.out_proj.weight"] = np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="effect_classifiers.3.out_proj has 2 classes; its "
                                         "attribute has 3"):
        param_names.tiered_from_torch(tensors, shapes, schema.NUM_CLASSES)


def test_save_pretrained_writes_hugging_faces_per_layer_msgpack(tmp_path):
    config = transformers.BertConfig(**BERT)
    params = traverse_util.unflatten_dict(random_tree(weights.expected_params(config)))
    weights.save_pretrained(tmp_path, config, params)
    saved = traverse_util.flatten_dict(weights.load_params(tmp_path / weights.FLAX_WEIGHTS))
    assert ("encoder", "layer", "2", "output", "dense", "kernel") in saved
    _, loaded = weights.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    # A stacked msgpack (this project's own tree) reads as well.
    weights.save_params(tmp_path / weights.FLAX_WEIGHTS, params)
    _, loaded = weights.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    assert jnp.asarray(loaded["encoder"]["layer"]["output"]["dense"]["kernel"]).shape == (
        3, 32, 16)
