"""One entry point that builds the Flax encoder for a Hugging Face config."""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

# model_type (as in a Hugging Face config.json) -> family that implements it.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("bert", "roberta", "deberta", "deberta-v2")


def build_encoder(hf_config, *, dtype=jnp.float32, remat: bool = False,
                  unroll: bool = False) -> nn.Module:
    """Returns the Flax encoder module for ``hf_config`` (a transformers PretrainedConfig).

    ``dtype`` is the compute dtype (parameters stay float32); ``remat`` rematerialises each layer
    in the backward pass to trade compute for memory; ``unroll`` unrolls the layers' scan.
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type in ("bert", "roberta"):
        from trip_jax.models.bert import BertEncoder
        return BertEncoder(config=hf_config, dtype=dtype, remat=remat, unroll=unroll)
    if model_type in ("deberta", "deberta-v2"):
        from trip_jax.models.deberta import DebertaEncoder
        return DebertaEncoder(config=hf_config, dtype=dtype, remat=remat, unroll=unroll)
    raise ValueError(
        f"unsupported encoder architecture model_type={model_type!r}; "
        f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
