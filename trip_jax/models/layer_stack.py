"""A stack of identical layers as one scanned module: a program whose size does not grow with depth.

``scanned(layer_cls, length=L, remat=...)`` returns the ``nn.scan`` of ``layer_cls`` over ``L``
layers (a leading layer axis, own keys per layer); a layer's ``__call__(carry, *args)`` returns
``(carry, None)``. ``Part``, ``Layer``, ``Stack``: the families' modules' shared fields.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn


class Part(nn.Module):
    """A family's module: its transformers ``config`` and compute ``dtype`` (parameters stay
    float32)."""

    config: Any
    dtype: Any = jnp.float32


class Layer(Part):
    """One layer of a stack (``scanned``); dropout is off when ``deterministic``."""

    deterministic: bool = True


class Stack(Part):
    """A module that runs the stack: ``remat`` rematerialises each layer in the backward pass,
    ``unroll`` unrolls the scan (``scanned``)."""

    remat: bool = False
    unroll: bool = False


def scanned(layer_cls: type[nn.Module], *, length: int, remat: bool = False,
            unroll: bool = False, in_axes=nn.broadcast) -> type[nn.Module]:
    """The module class running ``length`` stacked ``layer_cls`` layers (module docstring);
    ``unroll``: the loop unrolled in the program (same parameters, keys and values)."""
    body = nn.remat(layer_cls, prevent_cse=False) if remat else layer_cls
    return nn.scan(body, variable_axes={"params": 0},
                   split_rngs={"params": True, "dropout": True}, in_axes=in_axes,
                   length=length, unroll=length if unroll else 1)
