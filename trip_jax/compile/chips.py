"""Cloud TPU chips and accelerator types: public figures per chip and the topology of a type.

``accelerator("v5e-8")`` -> ``Accelerator`` (the chip, its JAX topology name "v5e:2x4", chips,
TensorCores); Cloud TPU's spellings (``v4-8``, ``v5litepod-8`` or ``v5e-8``, ``v5p-8``,
``v6e-8``) or a topology name itself (``v5e:2x2``). Figures: docs/compile.md#chips.
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's public figures: peak bf16 FLOP/s, HBM bytes and HBM bytes/s, and the
    TensorCores an accelerator type's suffix counts per chip."""

    name: str            # the topology's prefix: "v5e"
    device_kind: str     # what JAX calls its devices
    peak_flops: float    # bf16 matmul peak, FLOP/s
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s
    cores_per_chip: int   # TensorCores the accelerator type's suffix counts per chip
    dims: int             # torus dimensions of a slice
    source: str
    # libtpu's chip config giving one device a chip with all its HBM ("" : its default does)
    chip_config: str = ""

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a step is compute-bound on this chip."""
        return self.peak_flops / self.hbm_bandwidth


CHIPS: dict[str, Chip] = {c.name: c for c in (
    # cloud.google.com/tpu/docs/v4: 275 TFLOPs (bf16), HBM2 32 GiB, 1200 GBps; 2 TensorCores.
    # libtpu's default v4 config has one device per TensorCore (half the HBM each): megacore.
    Chip("v4", "TPU v4", 275e12, 32 * GIB, 1200e9, 2, 3, "https://cloud.google.com/tpu/docs/v4",
         chip_config="megacore"),
    # cloud.google.com/tpu/docs/v5e: 197 TFLOPs (bf16), HBM2 16 GB, 819 GBps; 1 TensorCore.
    Chip("v5e", "TPU v5 lite", 197e12, 16 * GIB, 819e9, 1, 2,
         "https://cloud.google.com/tpu/docs/v5e"),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOPs (bf16), HBM2e 95 GB, 2765 GBps; 2 TensorCores.
    Chip("v5p", "TPU v5", 459e12, 95 * GIB, 2765e9, 2, 3, "https://cloud.google.com/tpu/docs/v5p"),
    # cloud.google.com/tpu/docs/v6e: 918 TFLOPs (bf16), HBM 32 GB, 1640 GBps; 1 TensorCore.
    Chip("v6e", "TPU v6 lite", 918e12, 32 * GIB, 1640e9, 1, 2,
         "https://cloud.google.com/tpu/docs/v6e"),
)}
# Cloud TPU's names of a chip in accelerator types.
ALIASES = {"v4": "v4", "v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """An accelerator type: ``name`` as given, its chip (a ``Chip``, or a ``gpus.Gpu`` with
    platform "cuda"), the JAX topology name and its chips (GPUs)."""

    name: str
    chip: Chip
    topology: str
    chips: int
    platform: str = "tpu"


def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The torus shape Cloud TPU gives ``chips`` chips: 2D (v5e, v6e) 1x1, 1x2, 2x2, 2x4, 4x4 ...;
    3D (v4, v5p) 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4 ... (each doubling grows the smallest side,
    the last one of equal sides)."""
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"{chips} chips: a slice has a power of two")
    shape = [1] * dims
    if dims == 3 and chips >= 4:
        shape, chips = [2, 2, 1], chips // 4
    while chips > 1:
        smallest = min(shape)
        last = max(i for i, side in enumerate(shape) if side == smallest)
        shape[last] *= 2
        chips //= 2
    return tuple(shape)


def accelerator(name: str) -> Accelerator:
    """The ``Accelerator`` of a Cloud TPU accelerator type (``v5e-8``: the suffix counts
    TensorCores on v4 and v5p, chips on v5e and v6e) or a topology name (``v5e:2x2``);
    ValueError naming the accepted forms."""
    text = name.strip().lower()
    known = ", ".join(sorted(ALIASES))
    topology = re.fullmatch(r"(v\w+):(\d+(?:x\d+)+)", text)
    if topology:
        chip = CHIPS.get(ALIASES.get(topology.group(1), ""))
        sides = tuple(int(s) for s in topology.group(2).split("x"))
        if chip is None or len(sides) != chip.dims or min(sides) < 1:
            raise ValueError(f"unknown TPU topology {name!r} (e.g. v5e:2x2, v4:2x2x1; chips: "
                             f"{known})")
        return Accelerator(name, chip, text, math.prod(sides))
    match = re.fullmatch(r"(v\w+?)-(\d+)", text)
    chip = CHIPS.get(ALIASES.get(match.group(1), "")) if match else None
    if chip is None:
        raise ValueError(f"unknown TPU accelerator type {name!r} (e.g. v5e-8, v5litepod-8, v4-8, "
                         f"v5p-8, v6e-8, v5e-256, or a topology such as v5e:2x2; chips: {known})")
    cores = int(match.group(2))
    chips = cores // chip.cores_per_chip
    try:
        shape = slice_shape(chips, chip.dims) if cores % chip.cores_per_chip == 0 else None
    except ValueError:
        shape = None
    if shape is None:
        raise ValueError(f"TPU accelerator type {name!r}: {cores} "
                         f"{'TensorCores' if chip.cores_per_chip > 1 else 'chips'} is not a "
                         "slice size (a power of two)")
    return Accelerator(name, chip, f"{chip.name}:{'x'.join(map(str, shape))}", chips)
