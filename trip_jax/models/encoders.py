"""One entry point that builds the Flax encoder for a Hugging Face config (``registry``)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models import registry

# model_type (as in a Hugging Face config.json) values with a family here.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = registry.MODEL_TYPES


def build_encoder(hf_config, *, dtype=jnp.float32, remat: bool = False,
                  unroll: bool = False) -> nn.Module:
    """Returns the Flax encoder module for ``hf_config`` (a transformers PretrainedConfig).

    ``dtype`` is the compute dtype (parameters stay float32); ``remat`` rematerialises each layer
    in the backward pass to trade compute for memory; ``unroll`` unrolls the layers' scan.
    ValueError for a model_type no family serves, or an option its family lacks.
    """
    family = registry.family_of(getattr(hf_config, "model_type", None))
    for option, wanted in (("remat", remat), ("unroll", unroll)):
        if wanted and not getattr(family.capabilities, option):
            raise ValueError(f"model.{option}: the {family.name} encoder does not support it")
    return family.build(hf_config, dtype=dtype, remat=remat, unroll=unroll)
