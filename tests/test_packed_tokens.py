"""The packed_tokens layout: rows packed into token sequences, few compiled shapes, sharding."""

import dataclasses

import numpy as np
import pytest
import random_pairs

from trip_jax.config.messages import ConfigError
from trip_jax.config.typed import typed
from trip_jax.data import batch_contract, input_pipeline
from trip_jax.data import layouts
from trip_jax.data.batching import BatchPlan, Epoch
from trip_jax.data.layouts import packing

P = 32


@pytest.fixture(scope="module")
def encoded():
    return random_pairs.encoded_pairs(1, 40, entities=(1, 9), sentences=(4, 8), words=(2, 14))


@pytest.fixture(scope="module")
def layout(make_layout):
    """packed_tokens with P = 32, 4 shapes, no row dedup."""
    return make_layout(pack_length=P, max_shapes=4, dedup_rows=False)


def _plans(layout, encoded, batch_size, **kw):
    return layout.plan(encoded, Epoch(batch_size, **kw))


def test_pack_rows_places_every_row_without_overlap_first_fit():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 20, size=200)
    sequence, offset, used = packing.pack_rows(lengths, P)
    cover = np.zeros((used, P), int)
    for s, o, n in zip(sequence, offset, lengths):
        cover[s, o:o + n] += 1
    assert cover.max() == 1 and cover.sum() == lengths.sum()
    fill = cover.sum(axis=1)
    # First fit: every sequence but the last opened is more than P - longest row full.
    assert (fill[:-1] > P - lengths.max()).all()
    assert used <= lengths.sum() // (P - lengths.max() + 1) + 1
    again = packing.pack_rows(lengths, P)
    assert all(np.array_equal(a, b) for a, b in zip(again[:2], (sequence, offset)))
    with pytest.raises(ValueError, match="pack length"):
        packing.pack_rows(np.asarray([5, P + 1]), P)


def test_packed_token_batch_holds_each_row_as_one_segment(encoded, layout, make_layout):
    pairs = encoded[:3]
    E = max(p.num_entities for p in pairs)
    index = np.arange(3, dtype=np.int32)
    packed = layout.build(pairs, BatchPlan(index, E, {"N": 90, "R": 400, "K": 50}), 0)
    dense = make_layout("dense").build(pairs, BatchPlan(index, E, {"T": P}), 0)
    sizes = layout.check(packed)
    assert (sizes["N"], sizes["P"], sizes["R"], sizes["K"]) == (90, P, 400, 50)
    for key in batch_contract.PAIR_KEYS:
        np.testing.assert_array_equal(packed[key], dense[key])
    cells = np.flatnonzero(dense["row_mask"].reshape(-1))
    real = cells.size
    np.testing.assert_array_equal(packed["row_index"][:real], cells)
    assert (packed["row_index"][real:] == dense["row_mask"].size).all()
    ids, segments = packed["input_ids"].reshape(-1), packed["segment_ids"].reshape(-1)
    types = packed["token_type_ids"].reshape(-1)
    for r, cell in enumerate(cells):
        n = int(dense["attention_mask"][cell].sum())
        start = packed["row_start"][r]
        np.testing.assert_array_equal(ids[start:start + n], dense["input_ids"][cell, :n])
        np.testing.assert_array_equal(types[start:start + n], dense["token_type_ids"][cell, :n])
        # One segment id over the row, and a different one (or padding) right after it.
        assert len(set(segments[start:start + n])) == 1 and segments[start] > 0
        if (start + n) % P:
            assert segments[start + n] != segments[start]
    assert (segments > 0).sum() == sum(int(s.lengths.sum()) for p in pairs for s in p.stories)
    np.testing.assert_array_equal(packed["track_index"],
                                  packing.track_index(dense["row_mask"], 50))
    with pytest.raises(ValueError, match="do not fit"):
        layout.build(pairs, BatchPlan(index, E, {"N": 2}), 0)


def test_check_batch_catches_a_row_start_off_its_segment(encoded, layout):
    batch = layout.build(encoded[:1], BatchPlan(np.zeros(1, np.int32),
                                                encoded[0].num_entities, {}), 0)
    batch["row_start"] = batch["row_start"] + 1
    with pytest.raises(batch_contract.BatchContractError, match="first token"):
        layout.check(batch)


def test_shape_classes_are_the_cheapest_cut():
    demands = np.asarray([[1, 10, 2]] * 10 + [[2, 20, 3]] * 5 + [[9, 80, 12]])
    classes = packing.shape_classes(demands, 2, P)
    np.testing.assert_array_equal(classes, [[2, 20, 3], [9, 80, 12]])
    np.testing.assert_array_equal(packing.shape_classes(demands, 5, P),
                                  [[1, 10, 2], [2, 20, 3], [9, 80, 12]])
    np.testing.assert_array_equal(packing.shape_classes(demands, 1, P), [[9, 80, 12]])


@pytest.mark.parametrize("batch_size,shuffle", [(1, True), (8, True), (8, False)])
def test_at_most_max_shapes_per_epoch_and_every_batch_fits(encoded, layout, batch_size, shuffle):
    shapes = set()
    for epoch in (0, 1, 9):  # 9: past the epochs that chose the classes
        plans = _plans(layout, encoded, batch_size, shuffle=shuffle, seed=3, epoch=epoch)
        shapes |= {p.shape_key for p in plans}
        for plan in plans:
            pairs = [encoded[i] if i >= 0 else None for i in plan.pair_index]
            lengths = np.concatenate([s.lengths for p in pairs if p for s in p.stories])
            assert packing.pack_rows(lengths, P)[2] <= plan.sizes["N"]
            assert sum(p.num_rows for p in pairs if p) <= plan.sizes["R"]
    assert 1 <= len(shapes) <= 4
    batch = next(layout.batches(encoded, Epoch(batch_size, shuffle=shuffle, seed=3)))
    layout.check(batch)


def test_packed_tokens_uses_fewer_encoder_tokens_than_dense(encoded, layout, make_layout):
    stats = layout.stats(encoded, 1)
    dense = make_layout("dense").stats(encoded, 1)
    assert len(stats["shapes"]) <= 4
    assert stats["tokens"] < dense["tokens"] / 2
    assert stats["real_tokens"] <= stats["tokens"]


def test_processes_share_shapes_and_tracks(encoded, layout):
    plans = [_plans(layout, encoded, 4, shuffle=True, seed=1, process_index=i, process_count=2)
             for i in range(2)]
    for a, b in zip(*plans):
        assert a.shape_key == b.shape_key
        assert not set(a.pair_index[a.pair_index >= 0]) & set(b.pair_index[b.pair_index >= 0])


def test_batches_in_device_pieces_split_over_the_devices(encoded, layout):
    for shards in (1, 3):
        batch = next(layout.batches(encoded, Epoch(6, shards_per_process=shards)))
        sizes = layout.check(batch)
        assert sizes["N"] % shards == sizes["R"] % shards == sizes["K"] % shards == 0


def test_each_pieces_rows_start_in_its_own_sequences(encoded, layout):
    # The sharded steps read each piece's rows from its own sequences (models/tiered.py,
    # first_tokens); input_pipeline.global_batch refuses a batch whose rows do not.
    batch = next(layout.batches(encoded, Epoch(6, shards_per_process=3)))
    assert input_pipeline.rows_outside_their_piece(batch, 3) == 0
    moved = dict(batch, row_start=np.roll(batch["row_start"], len(batch["row_start"]) // 3))
    assert input_pipeline.rows_outside_their_piece(moved, 3) > 0


def test_layout_config_errors(make_layout):
    from configs import base

    data = base.get_config().data
    data.seq_len = 32
    with pytest.raises(ValueError, match="pack_length"):
        layouts.from_config(data)
    # A layout name, retired ("packed") or unknown, is refused by the schema, in one line.
    for name in ("packed_token", "packed"):
        config = base.get_config()
        config.data.layout = name
        with pytest.raises(ConfigError, match=f"data.layout: unknown value '{name}'; did you "
                                              "mean 'packed_tokens'"):
            typed(config)
    with pytest.raises(ValueError, match="data.pack_length"):
        make_layout(pack_length=0)


def test_a_batch_in_shards_packs_each_piece_on_its_own(encoded, layout):
    layout = dataclasses.replace(layout, dedup_rows=True)
    plan = _plans(layout, encoded, 4, shards_per_process=2)[0]
    pairs = [encoded[i] for i in plan.pair_index]
    whole = layout.build(pairs, plan, 0)
    layout.check(whole)
    half_sizes = {k: v // 2 for k, v in plan.sizes.items()}
    halves = [layout.build(pairs[2 * i:2 * i + 2],
                           BatchPlan(plan.pair_index[2 * i:2 * i + 2], plan.num_entities,
                                     half_sizes), 0) for i in range(2)]
    N, R = half_sizes["N"], half_sizes["R"]
    np.testing.assert_array_equal(whole["input_ids"][N:], halves[1]["input_ids"])
    # The second piece's rows read its own sequences and sit on its own pairs' cells.
    real = halves[1]["row_index"] < halves[1]["row_mask"].size
    np.testing.assert_array_equal(whole["row_start"][R:][real],
                                  halves[1]["row_start"][real] + N * P)
    np.testing.assert_array_equal(whole["row_index"][R:][real],
                                  halves[1]["row_index"][real] + halves[0]["row_mask"].size)
    with pytest.raises(ValueError, match="does not split over 3 devices"):
        _plans(layout, encoded, 4, shards_per_process=3)


def test_packing_summary_names_the_layout_and_its_shapes(encoded, layout):
    from trip_jax.data import input_pipeline

    line = input_pipeline.packing_summary(encoded, layout, 2)
    assert line.startswith(f"packed_tokens (P={P}), batch 2: ")
    assert line.endswith("batch shapes") and int(line.split()[-3]) <= 4
    stats = layout.stats(encoded, 2)
    per = stats["tokens"] / stats["real_tokens"]
    assert (f"{stats['tokens']:,} encoder tokens for {stats['real_tokens']:,} real tokens "
            f"({per:.2f} per real token") in line
    assert ("equal rows are encoded once" in line) == (per < 1)
