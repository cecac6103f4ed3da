"""The paper configs at their real shapes (``benchmarks.run --paper``), at reduced size.

The encoder directories ``benchmarks.paper_encoders`` writes load through the real
conversion path with the published widths; the harness pads entities as training does and
finds an epoch's largest batch; the device memory estimate follows its formula; the grid
holds the paper configs at exact fidelity. benchmarks/README.md, "The paper configs at their real
size", has the full-size results.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from benchmarks import cases, gpu_memory, harness, paper_encoders, report, run
from configs import base
from trip_jax.data import input_pipeline, protocol
from trip_jax.models import builders
from trip_jax.models import weights
from trip_jax.encoder_registry import build_encoder


@pytest.mark.parametrize("name", sorted(paper_encoders.PAPER_ENCODERS))
def test_encoder_dirs_load_with_the_published_widths(tmp_path, name):
    """One layer of the real width and a 64-token vocabulary: the transformers checkpoint
    converts with nothing missing or unused, and the encoder runs on it."""
    directory = paper_encoders.encoder_dir(name, 1, root=tmp_path,
                                           overrides={"vocab_size": 64})
    assert paper_encoders.encoder_dir(name, 1, root=tmp_path,
                                      overrides={"vocab_size": 64}) == directory  # cached
    hf_config, params = weights.load_pretrained(directory)  # strict: raises on any mismatch
    published = paper_encoders.PAPER_ENCODERS[name]
    hidden = published["hidden_size"]
    for key in ("model_type", "hidden_size", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size"):
        assert getattr(hf_config, key) == published[key], key
    assert hf_config.num_hidden_layers == 1 and hf_config.vocab_size == 64
    flat = _flat(params)
    assert flat["embeddings/word_embeddings/embedding"] == (64, hidden)
    if name == "deberta":
        # Relative attention over 2 x max_position_embeddings distances, no absolute positions.
        assert hf_config.pos_att_type == ["c2p", "p2c"] and hf_config.relative_attention
        assert flat["encoder/rel_embeddings/embedding"] == (1024, hidden)
        assert not any("position_embeddings" in k for k in flat)
    else:
        assert flat["embeddings/position_embeddings/embedding"][0] == published[
            "max_position_embeddings"]
    ids = np.full((2, 8), 5, np.int32)
    out = build_encoder(hf_config).apply({"params": params}, ids, np.ones_like(ids),
                                         np.zeros_like(ids), deterministic=True)
    hidden_states = out[0] if isinstance(out, tuple) else out
    assert hidden_states.shape == (2, 8, hidden) and np.isfinite(hidden_states).all()


def _flat(params) -> dict:
    from flax import traverse_util

    return {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(params).items()}


@pytest.mark.parametrize("name", sorted(cases.PAPER_CONFIGS))
def test_paper_models_are_the_paper_configs_around_a_local_encoder(monkeypatch, name):
    written = []
    monkeypatch.setattr(paper_encoders, "encoder_dir",
                        lambda n, layers=None: written.append((n, layers)) or f"/enc/{n}")
    config = cases.model_config(f"{name}_l2")
    paper = cases.PAPER_CONFIGS[name].get_config()
    assert written == [(name, 2)]
    assert config.model.encoder == f"/enc/{name}"
    assert config.model.tokenizer == cases.stand_in_tokenizer(name)
    assert base.fidelity_of(config) == "exact"
    assert config.train.learning_rate == paper.train.learning_rate
    assert config.model.tiered == paper.model.tiered
    cases.model_config(name)
    assert written[-1] == (name, None)  # the full depth
    with pytest.raises(ValueError, match="unknown model"):
        cases.model_config(f"{name}_2")


def test_harness_pads_entities_and_finds_the_largest_batch(tiny_config, data_dir):
    """E of every batch is the largest count of the protocol's three splits, as training's
    (``input_pipeline.prepare_data``); ``largest_batch`` is the batch of an epoch with the most
    encoder tokens."""
    config = tiny_config("")
    data = harness.ModelData.load("tiny", data_dir=data_dir)
    # tiny trains on 8 pairs of each split; the harness's pairs are every dev pair.
    trained = input_pipeline.prepare_data(config).layout.num_entities
    assert data.num_entities == max(trained, *(p.num_entities for p in data.encoded)) > trained
    config.data.max_pairs = 0
    splits = protocol.load_protocol_splits(config.data)
    assert data.num_entities <= max(s.num_entities for pairs in (
        splits.train, splits.selection, splits.test) for p in pairs for s in p.stories)
    h = harness.Harness(data, None, None, None)
    batch, pairs = h.largest_batch(2)
    sizes = [b["input_ids"].size for b in input_pipeline.batch_stream(h.encoded, h.layout, 2)]
    assert batch["input_ids"].size == max(sizes)
    assert batch["row_mask"].shape[2] == data.num_entities
    assert [p.num_rows for p in pairs] == [
        h.encoded[i].num_rows for i in batch["pair_index"][batch["pair_mask"]]]


def _case(model, layers, dtype, temps, *, timed_temp=None):
    """A train_speed record: plans {B: temp bytes} (args = 100 + B), or a timed case."""
    record = {"model": model, "layout": "config", "dtype": dtype, "batch_size": 1,
              "encoder": {"num_hidden_layers": layers},
              "state": {"param_bytes": 10 * layers, "opt_state_bytes": 20 * layers}}
    if timed_temp is not None:
        record["train"] = {"temp_bytes": timed_temp}
    record["memory_plans"] = [
        {"batch_size": b, "batch": {"pairs": b, "encoder_tokens": 1000 * b, "grid_slots": 9},
         "train": {"temp_bytes": t, "argument_bytes": 30 * layers + b}}
        for b, t in temps.items()]
    return record


def test_gpu_memory_follows_its_formula():
    records = [_case("roberta", 24, "float32", {}, timed_temp=1 + 22 * 1 + 3),
               _case("roberta_l1", 1, "float32", {1: 2, 8: 10}),
               _case("roberta_l2", 2, "float32", {1: 3, 8: 14})]
    records[0]["memory_plans"] = []
    entries = gpu_memory.estimates(records)
    assert [(e["dtype"], e["batch_size"]) for e in entries] == [("float32", 1), ("float32", 8)]
    one, eight = entries
    # state of the full model (24 layers) + batch + temp_l2 + 22 x (temp_l2 - temp_l1)
    assert one["state_bytes"] == 30 * 24 and one["batch_bytes"] == 1
    assert one["temp_bytes"] == 3 + 22 * 1 and eight["temp_bytes"] == 14 + 22 * 4
    assert eight["total_bytes"] == 30 * 24 + 8 + 14 + 22 * 4
    assert eight["bytes_per_pair"] == eight["total_bytes"] / 8
    assert one["check_full_over_measured"] == pytest.approx(25 / 26)
    assert eight["check_full_over_measured"] is None
    assert len(report.gpu_memory_rows(entries)[0]) == len(report.GPU_MEMORY_HEADER)
    # bfloat16 on a GPU: the encoder layers' share (L x layer) scaled by the residual ratio.
    eight = gpu_memory.estimates(records, {"roberta": {"ratio": 0.5}})[1]
    assert eight["gpu_bfloat16_bytes"] == eight["total_bytes"] - 0.5 * 24 * 4


def test_bfloat16_keeps_fewer_residual_bytes_per_layer_token():
    config = builders.encoder_config_from_dict(dict(
        model_type="roberta", vocab_size=64, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=80))
    ratios = gpu_memory.residual_ratios({"small": config})["small"]
    # At least the hidden states in and out of each matmul, 4 bytes each in float32.
    assert ratios["float32"] >= 4 * 4 * 32
    assert 0.4 < ratios["ratio"] < 1


def test_paper_grid_times_the_paper_configs_and_plans_their_reduced_depths():
    grid = cases.select_grid(smoke=False, paper=True)
    timed = [c for c in grid.cases if c.modes]
    assert [c.model for c in timed] == ["roberta", "bert", "deberta"]
    assert all(c.layout == "config" and c.batch == "largest" and c.batch_size == 1
               for c in timed)
    plans = {(c.model, c.dtype): c.plan_batch_sizes for c in grid.cases if not c.modes}
    assert plans == {(f"{e}_l{n}", d): (1, 8, 32) for e in ("roberta", "bert", "deberta")
                     for n in (1, 2) for d in ("float32", "bfloat16")}
    assert cases.LAYOUTS["config"].overrides == {}
    spec = dataclasses.asdict(timed[0])
    assert run._case_args(cases.Case(**{**spec, "modes": ("train",)}),
                          argparse.Namespace(dtype=None, remat=None, prng_impl=None)
                          )[1].count("largest") == 1
