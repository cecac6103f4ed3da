"""The batch contract (trip_jax.data.batch_contract): every producer of batches and the model's outputs
checked against the one table, and the check itself rejecting what breaks the contract."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from trip_jax.config.typed import typed
from trip_jax.data import batch_contract, input_pipeline
from trip_jax.evaluation import predict
from trip_jax.models import builders
from trip_jax.data.batch_contract import BatchContractError
from trip_jax.data import batching, features, layouts
from trip_jax.data.batching import BatchPlan

S = features.DEFAULT_MAX_SENTENCES


@pytest.fixture(scope="module")
def data(tiny_config):
    """The tiny config's pairs, tokenizer and layout (``input_pipeline.prepare_data``)."""
    return input_pipeline.prepare_data(tiny_config())


def test_build_batch_in_both_layouts(data, make_layout):
    pairs = data.train[:3]
    dense_layout = make_layout("dense")
    dense = dense_layout.build(pairs, BatchPlan(np.arange(3, dtype=np.int32), 16, {"T": 32}),
                               pairs[0].pad_id)
    assert dense_layout.check(dense)["R"] == 3 * 2 * 16 * S
    packed_layout = make_layout()
    packed = packed_layout.build(pairs + [None], BatchPlan(np.asarray([0, 1, 2, -1], np.int32),
                                                           16, {"N": 40, "R": 512, "K": 99}),
                                 pairs[0].pad_id)
    sizes = packed_layout.check(packed)
    assert (sizes["B"], sizes["N"], sizes["R"], sizes["K"]) == (4, 40, 512, 99)
    with pytest.raises(BatchContractError, match="missing \\['segment_ids', 'track_index'\\]"):
        packed_layout.check(dense)


def test_batching_shares_of_every_process(data):
    for process_index in range(2):
        epoch = batching.Epoch(4, shuffle=True, seed=3, epoch=1, process_index=process_index,
                               process_count=2)
        for batch in data.layout.batches(data.train, epoch):
            assert data.layout.check(batch)["B"] == 2


@pytest.mark.parametrize("split", ["train", "selection", "test"])
@pytest.mark.parametrize("options", [{}, {"name": "dense"}, {"dedup_rows": False}])
def test_input_pipeline_streams(data, make_layout, split, options):
    layout = make_layout(options.pop("name", "packed_tokens"), **options)
    layout = layout.for_splits(data.splits)
    encoded = getattr(data, split)
    seen = []
    for batch in input_pipeline.batch_stream(encoded, layout, 2, shuffle=True, seed=0, epoch=0):
        layout.check(batch)
        seen += batch["pair_index"][batch["pair_mask"]].tolist()
    assert sorted(seen) == list(range(len(encoded)))


def test_example_batch_is_a_dense_batch():
    example = builders.example_batch(S, seq_len=16)
    assert batch_contract.check_batch(example, layouts.Dense.fields, max_sentences=S) == {
        "R": 2 * S, "T": 16, "B": 1, "E": 1, "S": S}


def test_prediction_requests_become_contract_batches(data):
    line = {"stories": [["Ann took the cup.", "Ann broke the cup."],
                        ["Ann took the cup.", "Ann drank from the cup."]],
            "entities": [["cup", "Ann"], ["cup"]]}
    request = predict.parse_line(json.dumps(line), 1, S)
    pair = predict._pair(request, request.entities)
    encoded = input_pipeline.encode([pair], data.tokenizer, data.layout)
    [batch] = input_pipeline.batch_stream(encoded, data.layout, 2)
    data.layout.check(batch)
    assert batch["pair_mask"].tolist() == [True, False]


def test_model_outputs_follow_the_contract(data, tiny_config):
    config = typed(tiny_config())
    hf_config, _ = builders.build_encoder_config(config.model, data.tokenizer)
    model = builders.build_model(config, hf_config)
    batch = next(input_pipeline.batch_stream(data.test, data.layout, 2))
    sizes = data.layout.check(batch)
    # Shapes and dtypes only: jax.eval_shape traces the model without running it.
    outputs = jax.eval_shape(
        lambda rng: model.apply({"params": builders.init_params(model, rng, S)}, batch),
        jax.random.key(0))
    assert batch_contract.check_outputs(outputs, sizes) == {k: sizes[k] for k in "BES"}
    with pytest.raises(BatchContractError, match="'story_logits' has shape"):
        batch_contract.check_outputs(
            {**outputs, "story_logits": jax.ShapeDtypeStruct((2, 2, 1), np.float32)}, sizes)
    with pytest.raises(BatchContractError, match="'pre_pred' has dtype float32"):
        batch_contract.check_outputs(
            {**outputs, "pre_pred": jax.ShapeDtypeStruct(outputs["pre_pred"].shape, np.float32)},
            sizes)
    assert set(batch_contract.PREDICTION_KEYS) <= set(outputs)


def test_check_rejects_what_breaks_the_contract():
    good = builders.example_batch(S)
    fields = layouts.Dense.fields

    def check_batch(batch, **kw):
        return batch_contract.check_batch(batch, fields, **kw)

    check_batch(good)
    with pytest.raises(BatchContractError, match="missing \\['story_label'\\]"):
        check_batch({k: v for k, v in good.items() if k != "story_label"})
    with pytest.raises(BatchContractError, match="unknown \\['extra'\\]"):
        check_batch({**good, "extra": np.zeros(1)})
    with pytest.raises(BatchContractError, match="'row_mask' has dtype int32, expected bool"):
        check_batch({**good, "row_mask": good["row_mask"].astype(np.int32)})
    with pytest.raises(BatchContractError, match="dimension A is 19"):
        check_batch({**good, "pre_label": good["pre_label"][..., :19]})
    with pytest.raises(BatchContractError, match="dimension B is 2"):
        check_batch({**good, "story_label": np.zeros(2, np.int32)})
    with pytest.raises(BatchContractError, match="max_sentences=5"):
        check_batch(good, max_sentences=5)
    with pytest.raises(BatchContractError, match="row_index outside"):
        check_batch({**good, "row_index": good["row_index"] + 2})
    with pytest.raises(BatchContractError, match="row_start outside"):
        check_batch({**good, "row_start": good["row_start"] + 8})
    no_row = dict(good, row_index=np.full_like(good["row_index"], 2 * S))
    with pytest.raises(BatchContractError, match="has no encoder row"):
        check_batch(no_row)
    with pytest.raises(BatchContractError, match="rows starting at r\\*T"):
        layouts.Dense.check(_dense_layout(), {**good, "row_start": good["row_start"][::-1].copy()})


def _dense_layout():
    from configs import base

    data = base.get_config().data
    data.layout = "dense"
    return layouts.from_config(data)


def test_contract_table_names_every_key():
    table = batch_contract.describe(layouts.encoder_fields())
    for f in (*layouts.Dense.fields, *layouts.PackedTokens.fields, *batch_contract.PAIR_FIELDS,
              *batch_contract.OUTPUT_FIELDS):
        assert f"| `{f.name}` |" in table
    assert "| `segment_ids` | [N, P] | int32 | packed_tokens: " in table
    assert "| `row_start` | [R] | int32 | dense: " in table


def test_exact_fidelity_layout_pads_to_the_data_maximum_with_zero_token_types(tiny_config):
    config = tiny_config("fidelity=exact")
    config.data.max_pairs = 6
    run = input_pipeline.prepare_data(config)
    layout = run.layout
    assert (layout.entity_padding, layout.token_types, layout.max_length) == (
        "data_max", "zeros", 16)
    stories = [story for pairs in (run.splits.train, run.splits.selection, run.splits.test)
               for pair in pairs for story in pair.stories]
    largest = max(story.num_entities for story in stories)
    assert layout.num_entities == largest
    for encoded in (run.train, run.test):
        for batch in input_pipeline.batch_stream(encoded, layout, 2):
            layout.check(batch)
            assert batch["row_mask"].shape[2] == largest  # E: the data's, not a bucket
            assert not batch["token_type_ids"].any()
    clean = input_pipeline.prepare_data(tiny_config("fidelity=clean")).layout
    assert (clean.entity_padding, clean.token_types) == ("bucket", "segments")
    # "bucket": dense rounds E per batch; packed_tokens fixes it (few shapes).
    assert isinstance(clean, layouts.PackedTokens) and clean.num_entities is not None
    assert _dense_layout().for_splits(run.splits).num_entities is None
