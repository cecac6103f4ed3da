"""What ``--topology`` names: a Cloud TPU type (``chips``) or an NVIDIA GPU or node (``gpus``).

``target("v5e-8")`` or ``target("2xh100x8")`` -> ``chips.Accelerator`` (``platform`` "tpu" or
"cuda"); ValueError naming the accepted forms.
"""

from __future__ import annotations

from trip_jax.compile import chips, gpus


def target(name: str) -> chips.Accelerator:
    """The ``Accelerator`` ``name`` spells: a GPU (``h100``, ``h200x8``, ``2xh100x8``) or a TPU
    accelerator type or topology (``v5e-8``, ``v5e:2x2``)."""
    return gpus.node(name) if gpus.is_gpu_name(name) else chips.accelerator(name)
