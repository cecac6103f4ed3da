"""Hugging Face ``hidden_act`` names mapped to JAX functions (same formulas as transformers)."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp


def _gelu_tanh(x):
    # The tanh approximation written out, as in transformers' NewGELUActivation.
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_ACTIVATIONS: dict[str, Callable] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_python": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "linear": lambda x: x,
}


def get_activation(name: str) -> Callable:
    """Returns the activation function for a Hugging Face config's ``hidden_act`` value."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported hidden_act={name!r}; supported: {', '.join(sorted(_ACTIVATIONS))}"
        ) from None
