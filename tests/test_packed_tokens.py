"""The packed_tokens layout: rows packed into token sequences, few compiled shapes, sharding."""

import numpy as np
import pytest

from trip_jax import batch_contract, sharding
from trip_jax.data import batching, features
from trip_jax.data.features import encode_pairs, vocabulary_texts
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair, empty_states
from trip_jax.input_pipeline import Layout

WORDS = ("ann", "took", "the", "cup", "and", "put", "it", "in", "sink", "quickly", "very")
P = 32


def _story(rng, story_id, plausible):
    num_entities, num_sentences = int(rng.integers(1, 9)), int(rng.integers(4, 8))
    sentences = tuple(" ".join(rng.choice(WORDS, int(rng.integers(2, 14)))) + "."
                      for _ in range(num_sentences))
    states = empty_states(num_entities, num_sentences)
    states[rng.random(states.shape) < 0.05] = 1
    conflict = () if plausible else ((num_sentences - 3, num_sentences - 1),)
    return Story(story_id, sentences, tuple(f"thing{e}" for e in range(num_entities)), states,
                 plausible, conflict)


@pytest.fixture(scope="module")
def encoded():
    rng = np.random.default_rng(1)
    pairs = []
    for i in range(40):
        label = i % 2
        pairs.append(StoryPair(f"p{i}", tuple(_story(rng, f"{i}-{k}", k == label)
                                              for k in range(2)), label))
    return encode_pairs(pairs, load_tokenizer("word_level:bert", texts=vocabulary_texts(pairs)))


def test_pack_rows_places_every_row_without_overlap_first_fit():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 20, size=200)
    sequence, offset, used = features.pack_rows(lengths, P)
    cover = np.zeros((used, P), int)
    for s, o, n in zip(sequence, offset, lengths):
        cover[s, o:o + n] += 1
    assert cover.max() == 1 and cover.sum() == lengths.sum()
    fill = cover.sum(axis=1)
    # First fit: every sequence but the last opened is more than P - longest row full.
    assert (fill[:-1] > P - lengths.max()).all()
    assert used <= lengths.sum() // (P - lengths.max() + 1) + 1
    again = features.pack_rows(lengths, P)
    assert all(np.array_equal(a, b) for a, b in zip(again[:2], (sequence, offset)))
    with pytest.raises(ValueError, match="pack length"):
        features.pack_rows(np.asarray([5, P + 1]), P)


def test_packed_token_batch_holds_each_row_as_one_segment(encoded):
    pairs = encoded[:3]
    E = max(p.num_entities for p in pairs)
    packed = features.build_batch(pairs, [0, 1, 2], layout="packed_tokens", num_entities=E,
                                  seq_len=P, pad_id=0, num_sequences=90, num_rows=400,
                                  num_tracks=50)
    rows = features.build_batch(pairs, [0, 1, 2], layout="packed", num_entities=E, seq_len=P,
                                pad_id=0)
    sizes = batch_contract.check_batch(packed, layout="packed_tokens", max_sentences=7)
    assert (sizes["N"], sizes["P"], sizes["R"], sizes["K"]) == (90, P, 400, 50)
    for key in batch_contract.PAIR_KEYS:
        np.testing.assert_array_equal(packed[key], rows[key])
    real = rows["row_index"].size
    np.testing.assert_array_equal(packed["row_index"][:real], rows["row_index"])
    assert (packed["row_index"][real:] == rows["row_mask"].size).all()
    ids, segments = packed["input_ids"].reshape(-1), packed["segment_ids"].reshape(-1)
    types = packed["token_type_ids"].reshape(-1)
    for r in range(real):
        n = int(rows["attention_mask"][r].sum())
        start = packed["row_start"][r]
        np.testing.assert_array_equal(ids[start:start + n], rows["input_ids"][r, :n])
        np.testing.assert_array_equal(types[start:start + n], rows["token_type_ids"][r, :n])
        # One segment id over the row, and a different one (or padding) right after it.
        assert len(set(segments[start:start + n])) == 1 and segments[start] > 0
        if (start + n) % P:
            assert segments[start + n] != segments[start]
    assert (segments > 0).sum() == sum(int(s.lengths.sum()) for p in pairs for s in p.stories)
    np.testing.assert_array_equal(packed["track_index"],
                                  features.track_index(rows["row_mask"], 50))
    with pytest.raises(ValueError, match="do not fit"):
        features.build_batch(pairs, [0, 1, 2], layout="packed_tokens", num_entities=E,
                             seq_len=P, pad_id=0, num_sequences=2)


def test_check_batch_catches_a_row_start_off_its_segment(encoded):
    batch = features.build_batch(encoded[:1], [0], layout="packed_tokens",
                                 num_entities=encoded[0].num_entities, seq_len=P, pad_id=0)
    batch["row_start"] = batch["row_start"] + 1
    with pytest.raises(batch_contract.BatchContractError, match="first token"):
        batch_contract.check_batch(batch)


def test_shape_classes_are_the_cheapest_cut():
    demands = np.asarray([[1, 10, 2]] * 10 + [[2, 20, 3]] * 5 + [[9, 80, 12]])
    classes = batching.shape_classes(demands, 2, P)
    np.testing.assert_array_equal(classes, [[2, 20, 3], [9, 80, 12]])
    np.testing.assert_array_equal(batching.shape_classes(demands, 5, P),
                                  [[1, 10, 2], [2, 20, 3], [9, 80, 12]])
    np.testing.assert_array_equal(batching.shape_classes(demands, 1, P), [[9, 80, 12]])


@pytest.mark.parametrize("batch_size,shuffle", [(1, True), (8, True), (8, False)])
def test_at_most_max_shapes_per_epoch_and_every_batch_fits(encoded, batch_size, shuffle):
    shapes = set()
    for epoch in (0, 1, 9):  # 9: past the epochs that chose the classes
        plans = batching.plan_batches(encoded, batch_size, shuffle=shuffle, seed=3, epoch=epoch,
                                      layout="packed_tokens", seq_len=P, max_shapes=4)
        shapes |= {p.shape_key for p in plans}
        for plan in plans:
            pairs = [encoded[i] if i >= 0 else None for i in plan.pair_index]
            lengths = np.concatenate([s.lengths for p in pairs if p for s in p.stories])
            assert features.pack_rows(lengths, P)[2] <= plan.num_sequences
            assert sum(p.num_rows for p in pairs if p) <= plan.num_rows
    assert 1 <= len(shapes) <= 4
    batch = next(batching.batches(encoded, batch_size, shuffle=shuffle, seed=3,
                                  layout="packed_tokens", seq_len=P))
    batch_contract.check_batch(batch, layout="packed_tokens")


def test_packed_tokens_uses_fewer_encoder_tokens_and_shapes(encoded):
    stats = batching.layout_stats(encoded, 1, pack_length=P)
    assert len(stats["packed_tokens_shapes"]) <= 4 < len(stats["packed_shapes"])
    assert stats["packed_tokens_tokens"] < stats["packed_tokens"]
    assert stats["real_tokens"] <= stats["packed_tokens_tokens"]


def test_processes_share_shapes_and_tracks(encoded):
    plans = [batching.plan_batches(encoded, 4, shuffle=True, seed=1, layout="packed_tokens",
                                   seq_len=P, process_index=i, process_count=2)
             for i in range(2)]
    for a, b in zip(*plans):
        assert a.shape_key == b.shape_key
        assert not set(a.pair_index[a.pair_index >= 0]) & set(b.pair_index[b.pair_index >= 0])


def test_pad_rows_pads_sequences_rows_and_tracks(encoded):
    batch = next(batching.batches(encoded, 2, layout="packed_tokens", seq_len=P))
    padded = sharding.pad_rows(batch, 7)
    for key, dim in (("input_ids", "N"), ("row_start", "R"), ("track_index", "K")):
        assert padded[key].shape[0] % 7 == 0
    sizes = batch_contract.check_batch(padded, layout="packed_tokens")
    assert sizes["N"] % 7 == sizes["R"] % 7 == sizes["K"] % 7 == 0
    assert (padded["segment_ids"][batch["input_ids"].shape[0]:] == 0).all()


def test_layout_refuses_row_lengths_with_packed_tokens():
    with pytest.raises(ValueError, match="pack_length"):
        Layout(layout="packed_tokens", seq_len=32)
    with pytest.raises(ValueError, match="unknown data.layout"):
        Layout(layout="packed_token")


def test_a_batch_in_shards_packs_each_piece_on_its_own(encoded):
    plan = batching.plan_batches(encoded, 4, layout="packed_tokens", seq_len=P,
                                 shards_per_process=2, dedup_rows=True)[0]
    pairs = [encoded[i] for i in plan.pair_index]
    common = dict(layout="packed_tokens", num_entities=plan.num_entities, seq_len=P, pad_id=0,
                  dedup_rows=True)
    whole = features.build_batch(pairs, plan.pair_index, num_rows=plan.num_rows,
                                 num_sequences=plan.num_sequences, num_tracks=plan.num_tracks,
                                 shards=2, **common)
    batch_contract.check_batch(whole, layout="packed_tokens")
    halves = [features.build_batch(pairs[2 * i:2 * i + 2], plan.pair_index[2 * i:2 * i + 2],
                                   num_rows=plan.num_rows // 2,
                                   num_sequences=plan.num_sequences // 2,
                                   num_tracks=plan.num_tracks // 2, **common) for i in range(2)]
    N, R = plan.num_sequences // 2, plan.num_rows // 2
    np.testing.assert_array_equal(whole["input_ids"][N:], halves[1]["input_ids"])
    # The second piece's rows read its own sequences and sit on its own pairs' cells.
    real = halves[1]["row_index"] < halves[1]["row_mask"].size
    np.testing.assert_array_equal(whole["row_start"][R:][real],
                                  halves[1]["row_start"][real] + N * P)
    np.testing.assert_array_equal(whole["row_index"][R:][real],
                                  halves[1]["row_index"][real] + halves[0]["row_mask"].size)
    with pytest.raises(ValueError, match="does not split over 3 devices"):
        batching.plan_batches(encoded, 4, layout="packed_tokens", seq_len=P,
                              shards_per_process=3)


def test_packing_summary_names_the_layout_and_its_shapes(encoded):
    from trip_jax import input_pipeline

    line = input_pipeline.packing_summary(encoded, Layout(layout="packed_tokens", pack_length=P),
                                          2)
    assert line.startswith(f"packed_tokens (P={P}), batch 2: ")
    assert line.endswith("batch shapes") and int(line.split()[-3]) <= 4
