"""What a config describes, built: the tokenizer, the encoder's Hugging Face config, the model.

Training and evaluation both go through here, so a checkpoint's saved config (plus the saved
tokenizer and encoder config) rebuilds exactly the model that was trained.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import transformers

from trip_jax.data import batch_contract
from trip_jax.data.layouts import dense
from trip_jax import encoder_registry as registry
from trip_jax.data.tokenizers import tokenizer_info, tokenizer_spec
from trip_jax.models.tiered import TieredModel, build_tiered_model
from trip_jax.models.weights import load_pretrained

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def encoder_config_from_dict(values: dict[str, Any]) -> transformers.PretrainedConfig:
    """Rebuilds a Hugging Face config from ``PretrainedConfig.to_dict()`` output (less the
    writer's ``transformers_version``: a rebuilt config equals a fresh one, so their models
    share built steps, ``training.reuse``)."""
    values = dict(values)
    values.pop("transformers_version", None)
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def random_encoder_config(model_config, tokenizer) -> transformers.PretrainedConfig:
    """The Hugging Face config of ``model.random_encoder``, sized to the tokenizer."""
    info = tokenizer_info(tokenizer)
    values = dataclasses.asdict(model_config.random_encoder)
    values.update(vocab_size=info.vocab_size, pad_token_id=info.pad_id,
                  type_vocab_size=2 if info.uses_token_type_ids else 1)
    family = registry.family_of(values["model_type"])
    if family.random_config is not None:
        values = family.random_config(values)
    return encoder_config_from_dict(values)


def build_encoder_config(model_config, tokenizer):
    """Returns ``(hf_config, pretrained encoder params or None)`` for ``config.model``."""
    if model_config.encoder:
        hf_config, params = load_pretrained(model_config.encoder)
        vocab = tokenizer_info(tokenizer).vocab_size
        if vocab > hf_config.vocab_size:
            raise ValueError(f"tokenizer {tokenizer_spec(model_config)!r} has {vocab} tokens but "
                             f"encoder {model_config.encoder!r} embeds only {hf_config.vocab_size}")
        return hf_config, params
    return random_encoder_config(model_config, tokenizer), None


def build_model(config, hf_config) -> TieredModel:
    """The TieredModel of ``config`` around the encoder described by ``hf_config``."""
    model = config.model
    return build_tiered_model(hf_config, model.tiered, max_sentences=config.data.max_sentences,
                              dtype=DTYPES[model.dtype], remat=model.remat,
                              unroll=model.unroll_encoder,
                              matmul_precision=model.matmul_precision)


def example_batch(max_sentences: int, *, seq_len: int = 8) -> dict[str, np.ndarray]:
    """A one-pair, one-entity batch of the dense layout (``trip_jax.data.layouts.dense``; token
    ids and labels zero, every cell real) for initialising parameters and shapes."""
    B, E, S = 1, 1, max_sentences
    R = B * 2 * E * S
    batch = batch_contract.zeros({"B": B, "E": E, "S": S, "R": R, "T": seq_len}, dense.FIELDS)
    batch["attention_mask"][:] = 1
    batch["row_start"][:] = np.arange(R) * seq_len
    batch["row_index"][:] = np.arange(R)
    batch["row_mask"][:] = True
    batch["pair_mask"][:] = True
    return batch


def init_params(model: TieredModel, rng: jax.Array, max_sentences: int):
    """Freshly initialised parameters of ``model`` (use under jit or eval_shape)."""
    return model.init({"params": rng}, example_batch(max_sentences))["params"]
