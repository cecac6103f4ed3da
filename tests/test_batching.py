"""Batching: determinism, padding of the last batch, multi-process shares, bucketed shapes."""

import numpy as np
import pytest

from trip_jax.data import batching
from trip_jax.data.features import Buckets, encode_pairs, vocabulary_texts
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair, empty_states

NUM_PAIRS = 11
WORDS = ("ann", "took", "the", "cup", "and", "put", "it", "in", "sink", "quickly", "very")


def _story(rng, story_id, plausible):
    num_entities, num_sentences = int(rng.integers(1, 14)), int(rng.integers(5, 8))
    sentences = tuple(" ".join(rng.choice(WORDS, int(rng.integers(2, 12)))) + "."
                      for _ in range(num_sentences))
    states = empty_states(num_entities, num_sentences)
    states[rng.random(states.shape) < 0.05] = 1
    conflict = () if plausible else ((num_sentences - 3, num_sentences - 1),)
    return Story(story_id, sentences, tuple(f"thing{e}" for e in range(num_entities)), states,
                 plausible, conflict)


@pytest.fixture(scope="module")
def encoded():
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(NUM_PAIRS):
        label = i % 2
        stories = [_story(rng, f"{i}-{k}", k == label) for k in range(2)]
        pairs.append(StoryPair(f"p{i}", tuple(stories), label))
    return encode_pairs(pairs, load_tokenizer("word_level:bert", texts=vocabulary_texts(pairs)))


def _all(encoded, batch_size, **kw):
    return list(batching.batches(encoded, batch_size, **kw))


def _same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize("layout", ["packed", "dense"])
def test_same_seed_and_epoch_give_the_same_batches(encoded, layout):
    first = _all(encoded, 4, shuffle=True, seed=3, epoch=1, layout=layout)
    assert _same(first, _all(encoded, 4, shuffle=True, seed=3, epoch=1, layout=layout))
    orders = [np.concatenate([b["pair_index"] for b in _all(encoded, 4, shuffle=True, seed=3,
                                                             epoch=e, layout=layout)])
              for e in (1, 2)]
    assert not np.array_equal(orders[0], orders[1])
    plain = np.concatenate([b["pair_index"] for b in _all(encoded, 4, layout=layout)])
    assert plain.tolist() == list(range(NUM_PAIRS)) + [-1]


def test_every_pair_once_and_padded_last_batch(encoded):
    out = _all(encoded, 4, shuffle=True, seed=5)
    assert len(out) == batching.num_batches(NUM_PAIRS, 4) == 3
    index = np.concatenate([b["pair_index"] for b in out])
    assert sorted(index[index >= 0].tolist()) == list(range(NUM_PAIRS))
    last = out[-1]
    assert last["pair_mask"].tolist() == [True, True, True, False]
    assert last["pair_index"][3] == -1 and not last["row_mask"][3].any()
    assert last["story_label"][3] == 0 and not last["pre_label"][3].any()
    for batch in out:
        for b, i in enumerate(batch["pair_index"]):
            if i >= 0:
                assert batch["story_label"][b] == encoded[i].label
                assert batch["row_mask"][b].sum() == encoded[i].num_rows
    dropped = _all(encoded, 4, shuffle=True, seed=5, drop_remainder=True)
    assert len(dropped) == batching.num_batches(NUM_PAIRS, 4, drop_remainder=True) == 2
    assert all(b["pair_mask"].all() for b in dropped)


@pytest.mark.parametrize("process_count", [2, 4])
@pytest.mark.parametrize("layout", ["packed", "dense"])
def test_process_shares_are_disjoint_and_cover_the_global_batch(encoded, process_count, layout):
    kw = dict(shuffle=True, seed=7, epoch=2, layout=layout)
    whole = _all(encoded, 8, **kw)
    shares = [_all(encoded, 8, process_index=p, process_count=process_count, **kw)
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
        for key in ("row_mask", "pre_label", "conflict_label", "story_label", "pair_mask"):
            np.testing.assert_array_equal(np.concatenate([b[key] for b in local]),
                                          global_batch[key])
    with pytest.raises(ValueError, match="divisible"):
        _all(encoded, 6, process_count=4)


def test_shapes_come_from_bucket_sets(encoded):
    buckets = Buckets()
    for layout in ("packed", "dense"):
        for batch in _all(encoded, 2, layout=layout):
            B, _, E, S = batch["row_mask"].shape
            R, T = batch["input_ids"].shape
            assert (B, S) == (2, 7) and E in (8, 12, 16) and T % 8 == 0
            pairs = [encoded[i] for i in batch["pair_index"] if i >= 0]
            assert T == buckets.tokens(max(p.max_length for p in pairs))
            assert E == buckets.entities(max(p.num_entities for p in pairs))
            if layout == "dense":
                assert R == B * 2 * E * S
            else:
                assert R == buckets.rows(sum(p.num_rows for p in pairs))
    fixed = _all(encoded, 2, seq_len=40)
    assert {b["input_ids"].shape[1] for b in fixed} == {40}
    with pytest.raises(ValueError, match="seq_len"):
        _all(encoded, 2, seq_len=8)


def test_layout_stats_counts_rows(encoded):
    stats = batching.layout_stats(encoded, 4)
    real = sum(p.num_rows for p in encoded)
    dense = sum(b["input_ids"].shape[0] for b in _all(encoded, 4, layout="dense"))
    assert stats["real_rows"] == real and stats["dense_rows"] == dense
    assert stats["dense_real_fraction"] == pytest.approx(real / dense)
    assert 0 < stats["dense_real_fraction"] < stats["packed_real_fraction"] <= 1


def test_short_row_group_holds_each_short_row_once(encoded):
    short_seq_len = 12
    for batch in _all(encoded, 2, short_seq_len=short_seq_len):
        pairs = [encoded[i] for i in batch["pair_index"] if i >= 0]
        lengths = np.concatenate([s.lengths for p in pairs for s in p.stories])
        n_short = int((lengths <= short_seq_len).sum())
        buckets = Buckets()
        assert batch["short_input_ids"].shape == (buckets.rows(n_short), short_seq_len)
        slots = batch["row_mask"].size
        grid = {}
        for prefix, width in (("", batch["input_ids"].shape[1]), ("short_", short_seq_len)):
            real = batch[prefix + "row_index"] < slots
            assert real.sum() == (n_short if prefix else lengths.size - n_short)
            row_lengths = batch[prefix + "attention_mask"][real].sum(axis=1)
            assert (row_lengths <= short_seq_len).all() == bool(prefix)
            for cell, ids, n in zip(batch[prefix + "row_index"][real],
                                    batch[prefix + "input_ids"][real], row_lengths):
                grid[int(cell)] = ids[:n].tolist()
        # Every real cell is written once, with the tokens of the one-group layout.
        one_group = next(iter(_all([encoded[i] for i in batch["pair_index"] if i >= 0], 2)))
        expected = {int(c): ids[:m.sum()].tolist() for c, ids, m in zip(
            one_group["row_index"], one_group["input_ids"], one_group["attention_mask"])
            if c < slots}
        assert grid == expected


def test_short_row_group_errors_and_shape_keys(encoded):
    with pytest.raises(ValueError, match="packed layout only"):
        _all(encoded, 2, layout="dense", short_seq_len=8)
    with pytest.raises(ValueError, match="between 1 and seq_len - 1"):
        _all(encoded, 2, seq_len=40, short_seq_len=40)
    plans = batching.plan_batches(encoded, 2, short_seq_len=12)
    assert all(p.shape_key == (p.num_entities, p.num_rows, p.seq_len, p.num_short_rows, 12, 0, 0)
               for p in plans)


def test_layout_stats_counts_tokens_and_compiled_shapes(encoded):
    one = batching.layout_stats(encoded, 1)
    split = batching.layout_stats(encoded, 1, short_seq_len=12)
    tokens = sum(b["input_ids"].size for b in _all(encoded, 1))
    assert one["packed_tokens"] == tokens
    assert split["packed_tokens"] == sum(b["input_ids"].size + b["short_input_ids"].size
                                         for b in _all(encoded, 1, short_seq_len=12))
    assert split["packed_tokens"] < one["packed_tokens"]
    assert split["real_tokens"] == one["real_tokens"] > 0
    assert one["packed_shapes"] == sorted({(b["row_mask"].shape[2], *b["input_ids"].shape,
                                            0, 0, 0, 0)
                                           for b in _all(encoded, 1)})
