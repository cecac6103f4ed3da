"""A stack of identical layers as one scanned module: a program whose size does not grow with depth.

``scanned(layer_cls, length=L, remat=...)`` returns the ``nn.scan`` of ``layer_cls`` over ``L``
layers (parameters with a leading layer axis, own keys per layer, optional remat and unroll); a layer's
``__call__(carry, *args)`` returns ``(carry, None)``. Details: docs/reference.md#model.
"""

from __future__ import annotations

from flax import linen as nn


def scanned(layer_cls: type[nn.Module], *, length: int, remat: bool = False,
            unroll: bool = False, in_axes=nn.broadcast) -> type[nn.Module]:
    """The module class running ``length`` stacked ``layer_cls`` layers (module docstring);
    ``unroll``: the loop unrolled in the program (same parameters, keys and values)."""
    body = nn.remat(layer_cls, prevent_cse=False) if remat else layer_cls
    return nn.scan(body, variable_axes={"params": 0},
                   split_rngs={"params": True, "dropout": True}, in_axes=in_axes,
                   length=length, unroll=length if unroll else 1)
