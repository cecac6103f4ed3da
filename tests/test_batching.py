"""Batching: determinism, padding of the last batch, multi-process shares, bucketed shapes
(the dense layout's), encoder load statistics."""

import numpy as np
import pytest
import random_pairs

from trip_jax.data import batching

NUM_PAIRS = 11


@pytest.fixture(scope="module")
def encoded():
    return random_pairs.encoded_pairs(0, NUM_PAIRS, entities=(1, 14), sentences=(5, 8),
                                      words=(2, 12))


LAYOUTS = ["packed_tokens", "dense"]


def _all(encoded, layout, batch_size, **kw):
    return list(layout.batches(encoded, batching.Epoch(batch_size, **kw)))


def _same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize("name", LAYOUTS)
def test_same_seed_and_epoch_give_the_same_batches(encoded, make_layout, name):
    layout = make_layout(name)
    first = _all(encoded, layout, 4, shuffle=True, seed=3, epoch=1)
    assert _same(first, _all(encoded, layout, 4, shuffle=True, seed=3, epoch=1))
    orders = [np.concatenate([b["pair_index"] for b in _all(encoded, layout, 4, shuffle=True,
                                                             seed=3, epoch=e)])
              for e in (1, 2)]
    assert not np.array_equal(orders[0], orders[1])
    plain = np.concatenate([b["pair_index"] for b in _all(encoded, layout, 4)])
    assert plain.tolist() == list(range(NUM_PAIRS)) + [-1]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_pair_once_and_padded_last_batch(encoded, make_layout, name):
    layout = make_layout(name)
    out = _all(encoded, layout, 4, shuffle=True, seed=5)
    assert len(out) == batching.num_batches(NUM_PAIRS, 4) == 3
    index = np.concatenate([b["pair_index"] for b in out])
    assert sorted(index[index >= 0].tolist()) == list(range(NUM_PAIRS))
    last = out[-1]
    assert last["pair_mask"].tolist() == [True, True, True, False]
    assert last["pair_index"][3] == -1 and not last["row_mask"][3].any()
    assert last["story_label"][3] == 0 and not last["pre_label"][3].any()
    for batch in out:
        layout.check(batch)
        for b, i in enumerate(batch["pair_index"]):
            if i >= 0:
                assert batch["story_label"][b] == encoded[i].label
                assert batch["row_mask"][b].sum() == encoded[i].num_rows
    dropped = _all(encoded, layout, 4, shuffle=True, seed=5, drop_remainder=True)
    assert len(dropped) == batching.num_batches(NUM_PAIRS, 4, drop_remainder=True) == 2
    assert all(b["pair_mask"].all() for b in dropped)


@pytest.mark.parametrize("process_count", [2, 4])
@pytest.mark.parametrize("name", LAYOUTS)
def test_process_shares_are_disjoint_and_cover_the_global_batch(encoded, make_layout,
                                                                 process_count, name):
    layout = make_layout(name)
    kw = dict(shuffle=True, seed=7, epoch=2)
    # Built in one piece per process, the shares are the global batch's pieces.
    whole = _all(encoded, layout, 8, shards_per_process=process_count, **kw)
    shares = [_all(encoded, layout, 8, process_index=p, process_count=process_count, **kw)
              for p in range(process_count)]
    assert {len(s) for s in shares} == {len(whole)}
    for g, global_batch in enumerate(whole):
        local = [s[g] for s in shares]
        # Same shapes on every process, so the local batches form one global array.
        assert len({tuple((k, v.shape) for k, v in b.items()) for b in local}) == 1
        index = np.concatenate([b["pair_index"] for b in local])
        np.testing.assert_array_equal(index, global_batch["pair_index"])
        real = index[index >= 0]
        assert len(set(real.tolist())) == real.size
        for key in ("row_mask", "pre_label", "conflict_label", "story_label", "pair_mask",
                    "input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(np.concatenate([b[key] for b in local]),
                                          global_batch[key])
    with pytest.raises(ValueError, match="divisible"):
        _all(encoded, layout, 6, process_count=4)


def test_dense_shapes_come_from_bucket_sets(encoded, make_layout):
    layout = make_layout("dense")
    buckets = layout.buckets
    for batch in _all(encoded, layout, 2):
        B, _, E, S = batch["row_mask"].shape
        R, T = batch["input_ids"].shape
        assert (B, S) == (2, 7) and E in (8, 12, 16) and T % 8 == 0
        pairs = [encoded[i] for i in batch["pair_index"] if i >= 0]
        assert T == buckets.tokens(max(p.max_length for p in pairs))
        assert E == buckets.entities(max(p.num_entities for p in pairs))
        assert R == B * 2 * E * S
        np.testing.assert_array_equal(batch["row_start"], np.arange(R) * T)
    fixed = _all(encoded, make_layout("dense", seq_len=40), 2)
    assert {b["input_ids"].shape[1] for b in fixed} == {40}
    with pytest.raises(ValueError, match="seq_len"):
        _all(encoded, make_layout("dense", seq_len=8), 2)


def test_layout_stats_count_rows_tokens_and_compiled_shapes(encoded, make_layout):
    real = sum(p.num_rows for p in encoded)
    real_tokens = sum(int(s.lengths.sum()) for p in encoded for s in p.stories)
    stats = {}
    for name in LAYOUTS:
        layout = make_layout(name, dedup_rows=False) if name == "packed_tokens" else (
            make_layout(name))
        batches = _all(encoded, layout, 4)
        stats[name] = layout.stats(encoded, 4)
        assert stats[name]["real_rows"] == real and stats[name]["real_tokens"] == real_tokens
        assert stats[name]["tokens"] == sum(b["input_ids"].size for b in batches)
        assert stats[name]["rows"] == sum(b["row_index"].size for b in batches)
        assert stats[name]["real_fraction"] == pytest.approx(real / stats[name]["rows"])
        assert len(stats[name]["shapes"]) == len(
            {tuple((k, v.shape) for k, v in b.items()) for b in batches})
    assert 0 < stats["dense"]["real_fraction"] < stats["packed_tokens"]["real_fraction"] <= 1
    assert stats["dense"]["token_fraction"] < stats["packed_tokens"]["token_fraction"] <= 1
