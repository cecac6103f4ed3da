"""The one name table of the parameters: per-layer names <-> stacked layers, PyTorch <-> Flax.

Flat trees ({path tuple: array}), numpy only: ``stack_layers`` / ``unstack_layers``,
``per_layer_paths``, and ``tiered_to_torch`` / ``tiered_from_torch`` for a whole model.
The table: docs/convert.md#what-is-mapped.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from trip_jax import encoder_registry as registry
from trip_jax.encoder_registry import Path_


@functools.cache
def _stacks() -> tuple[tuple[Path_, Path_], ...]:
    """The stacks: (the stacked module's path, the path of layer {}), both from a parent module
    name: each encoder family's (``registry``), then the tiered model's detector. Read on first
    use: the family units import Flax, this module is numpy only."""
    return tuple(dict.fromkeys(
        [(f.layers.stacked, f.layers.per_layer) for f in registry.families()]
        + [(("detector", "layers"), ("detector", "layer_{}"))]))


ENCODER = "embedding."  # the encoder's PyTorch prefix
HEAD_GROUPS = ("precondition_classifiers", "effect_classifiers")
HEADS: Path_ = ("state_heads", "heads")
_PROJECTIONS: tuple[tuple[Path_, str], ...] = (
    (("embedding_proj",), "embedding_proj"), (("states_proj",), "states_proj"),
    (("detector", "conflict_out"), "decoder"))
_ATTENTION_ROWS = ("query", "key", "value")
# Detector layer modules renamed one to one: Flax sub-path -> PyTorch sub-name.
_DETECTOR_MODULES: tuple[tuple[Path_, str], ...] = (
    (("self_attention", "out"), "self_attn.out_proj"), (("ff_in",), "linear1"),
    (("ff_out",), "linear2"), (("attention_norm",), "norm1"), (("ff_norm",), "norm2"))


@dataclasses.dataclass(frozen=True)
class Shape:
    """The shape and dtype of one layer's slice of a stacked shape-only leaf."""

    shape: tuple[int, ...]
    dtype: Any


# ------------------------------------------------------------------------------------------
# Stacked layers.

def _stacked(path: Path_) -> tuple[Path_, Path_] | None:
    """(path through the stacked module, rest) of a stacked parameter, else None."""
    for k in range(len(path)):
        for stacked, _ in _stacks():
            end = k + len(stacked)
            if path[k:end] == stacked and end < len(path) and not path[end].isdigit():
                return path[:end], path[end:]
    return None


def _per_layer(path: Path_) -> tuple[Path_, int, Path_] | None:
    """(stacked module's path, layer index, rest) of a per-layer parameter, else None."""
    for k in range(len(path) - 1):
        for stacked, names in _stacks():
            below = path[k:k + len(names)]
            found = re.fullmatch("/".join(names).replace("{}", r"(\d+)"), "/".join(below))
            if found and k + len(names) < len(path):
                return (path[:k] + stacked, int(found.group(1)), path[k + len(names):])
    return None


def _layer_path(stacked: Path_, i: int, rest: Path_) -> Path_:
    for pattern, names in _stacks():
        if stacked[len(stacked) - len(pattern):] == pattern:
            return (stacked[:len(stacked) - len(pattern)] + tuple(n.format(i) for n in names)
                    + rest)
    raise ValueError(f"{'/'.join(stacked)} is no stack of layers")


def _slice(value, i: int):
    if hasattr(value, "__getitem__"):
        return value[i]
    return Shape(tuple(value.shape[1:]), value.dtype)


def unstack_layers(flat: Mapping[Path_, Any]) -> dict[Path_, Any]:
    """Every stacked parameter split into its layers' per-layer paths (shape-only leaves become
    ``Shape`` slices); the other entries as they are."""
    out = {}
    for path, value in flat.items():
        found = _stacked(path)
        if found is None:
            out[path] = value
            continue
        stacked, rest = found
        for i in range(value.shape[0]):
            out[_layer_path(stacked, i, rest)] = _slice(value, i)
    return out


def layer_paths(path: Path_, count: int) -> list[Path_] | None:
    """The per-layer paths of the ``count`` layers of the stacked parameter at ``path``, or
    None when ``path`` is not a stacked parameter."""
    found = _stacked(path)
    return None if found is None else [_layer_path(found[0], i, found[1]) for i in range(count)]


def per_layer_paths(flat: Mapping[Path_, Any]) -> list[Path_]:
    """The paths of ``flat`` that name one layer (``encoder/layer/<i>/...``,
    ``detector/layer_<i>/...``), sorted."""
    return sorted(p for p in flat if _per_layer(p) is not None)


def stack_layers(flat: Mapping[Path_, Any]) -> dict[Path_, Any]:
    """Every group of per-layer parameters stacked on a leading axis, in layer order (numpy; a
    ``Shape`` group gives a ``Shape``); the other entries as they are. ValueError naming the
    group when its layers are not 0..n-1 or their shapes differ."""
    out, groups = {}, {}
    for path, value in flat.items():
        found = _per_layer(path)
        if found is None:
            out[path] = value
            continue
        stacked, i, rest = found
        groups.setdefault(stacked + rest, {})[i] = value
    for path, layers in groups.items():
        name = "/".join(path)
        if sorted(layers) != list(range(len(layers))):
            raise ValueError(f"{name}: layers {sorted(layers)} are not 0..{len(layers) - 1}")
        shapes = {tuple(v.shape) for v in layers.values()}
        if len(shapes) > 1:
            raise ValueError(f"{name}: the layers' shapes differ ({sorted(shapes)})")
        values = [layers[i] for i in range(len(layers))]
        if isinstance(values[0], Shape):
            out[path] = Shape((len(values),) + values[0].shape, values[0].dtype)
        else:
            out[path] = np.stack([np.asarray(v) for v in values])
    return out


# ------------------------------------------------------------------------------------------
# PyTorch <-> Flax.

def _kernel_from_torch(w: np.ndarray) -> np.ndarray:
    # Linear [out, in] -> [in, out]; ConvNd [out, in, *k] -> [*k, in, out].
    return np.transpose(w, tuple(range(2, w.ndim)) + (1, 0)) if w.ndim >= 2 else w


def _kernel_to_torch(k: np.ndarray) -> np.ndarray:
    # The inverse of _kernel_from_torch.
    n = k.ndim
    return np.transpose(k, (n - 1, n - 2) + tuple(range(n - 2))) if n >= 2 else k


def _candidates(path: Path_):
    """Flax names a PyTorch tensor may have, each with the transform its value needs."""
    *module, leaf = path
    module = tuple(module)
    if leaf == "weight":
        return [(module + ("kernel",), _kernel_from_torch), (module + ("embedding",), None),
                (module + ("scale",), None), (path, None)]
    if leaf == "gamma":
        return [(module + ("scale",), None), (path, None)]
    if leaf == "beta":
        return [(module + ("bias",), None), (path, None)]
    return [(path, None)]


def encoder_match(path: Path_, expected: Mapping[Path_, Any]):
    """(Flax path, transform or None) of the encoder tensor at PyTorch ``path`` (split at the
    dots) among the per-layer Flax paths ``expected``, or None when it has no place."""
    for target, transform in _candidates(path):
        if target in expected:
            return target, transform
    return None


def encoder_torch_name(path: Path_, value: np.ndarray) -> tuple[str, np.ndarray]:
    """The PyTorch name and value of the per-layer encoder parameter at Flax ``path``."""
    *module, leaf = path
    if leaf in ("kernel", "embedding", "scale"):
        return ".".join((*module, "weight")), (_kernel_to_torch(value) if leaf == "kernel"
                                               else value)
    return ".".join(path), value


def _linear_to_torch(kernel: np.ndarray) -> np.ndarray:
    """A Dense or DenseGeneral kernel [*in, out] -> a Linear weight [out, prod(in)]."""
    return kernel.reshape(-1, kernel.shape[-1]).T


def tiered_to_torch(flat: Mapping[Path_, Any], num_classes: tuple[int, ...]
                    ) -> dict[str, np.ndarray]:
    """A TieredModel's flat (stacked) parameters under the PyTorch names of the table."""
    flat = unstack_layers({p: np.asarray(v, np.float32) for p, v in flat.items()})
    out: dict[str, np.ndarray] = {}
    for path, value in flat.items():
        if path[0] == "encoder":
            name, value = encoder_torch_name(path[1:], value)
            out[ENCODER + name] = value
    groups = [(g, a, n) for g in HEAD_GROUPS for a, n in enumerate(num_classes)]
    for k, (group, a, n) in enumerate(groups):
        head = f"{group}.{a}."
        out[head + "dense.weight"] = flat[HEADS + ("dense", "kernel")][k].T
        out[head + "dense.bias"] = flat[HEADS + ("dense", "bias")][k]
        out[head + "out_proj.weight"] = flat[HEADS + ("out_proj", "kernel")][k][:, :n].T
        out[head + "out_proj.bias"] = flat[HEADS + ("out_proj", "bias")][k][:n]
    for ours, theirs in _PROJECTIONS:
        out[f"{theirs}.weight"] = flat[ours + ("kernel",)].T
        out[f"{theirs}.bias"] = flat[ours + ("bias",)]
    for i in _detector_layers(flat):
        ours, theirs = ("detector", f"layer_{i}"), f"detector.layers.{i}."
        attention = ours + ("self_attention",)
        d = flat[attention + ("query", "kernel")].shape[0]
        out[theirs + "self_attn.in_proj_weight"] = np.concatenate(
            [flat[attention + (k, "kernel")].reshape(d, d).T for k in _ATTENTION_ROWS])
        out[theirs + "self_attn.in_proj_bias"] = np.concatenate(
            [flat[attention + (k, "bias")].reshape(d) for k in _ATTENTION_ROWS])
        for module, name in _DETECTOR_MODULES:
            path = ours + module
            out[f"{theirs}{name}.weight"] = (_linear_to_torch(flat[path + ("kernel",)])
                                             if path + ("kernel",) in flat
                                             else flat[path + ("scale",)])
            out[f"{theirs}{name}.bias"] = flat[path + ("bias",)].reshape(-1)
    return out


def _detector_layers(flat: Mapping[Path_, Any]) -> list[int]:
    """The indices of the per-layer detector layers in ``flat``."""
    found = {_per_layer(p)[1] for p in flat if p[0] == "detector" and _per_layer(p)}
    return sorted(found)


def tiered_from_torch(tensors: Mapping[str, np.ndarray], expected: Mapping[Path_, Any],
                      num_classes: tuple[int, ...]
                      ) -> tuple[dict[Path_, np.ndarray], list[str]]:
    """The table's inverse: (flat stacked parameters filled from ``tensors`` (float32), names
    of the tensors with no place). ``expected`` is the flat stacked tree (path -> leaf with a
    shape) of the parameters to fill; a parameter some tensor lacks (or some layer of it) is
    left out, for the caller to report. ValueError naming the head whose class count is not its
    attribute's (``num_classes``)."""
    per_layer = unstack_layers(expected)
    tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    flat: dict[Path_, np.ndarray] = {}

    def put(path: Path_, name: str, convert=lambda v: v) -> None:
        if path in per_layer and name in tensors:
            flat[path] = _shaped(convert(tensors.pop(name)), per_layer[path].shape)

    inner = {p[1:]: v for p, v in per_layer.items() if p[0] == "encoder"}
    for name in [n for n in tensors if n.startswith(ENCODER)]:
        hit = encoder_match(tuple(name[len(ENCODER):].split(".")), inner)
        if hit is not None:
            target, transform = hit
            value = tensors.pop(name)
            flat[("encoder",) + target] = value if transform is None else transform(value)
    if HEADS + ("dense", "kernel") in per_layer:
        _heads_from_torch(tensors, per_layer, flat, num_classes)
    for ours, theirs in _PROJECTIONS:
        put(ours + ("kernel",), f"{theirs}.weight", np.transpose)
        put(ours + ("bias",), f"{theirs}.bias")
    for i in _detector_layers(per_layer):
        ours, theirs = ("detector", f"layer_{i}"), f"detector.layers.{i}."
        attention = ours + ("self_attention",)
        weight, bias = (tensors.get(theirs + f"self_attn.in_proj_{k}") for k in ("weight",
                                                                                  "bias"))
        if weight is not None and bias is not None:
            tensors.pop(theirs + "self_attn.in_proj_weight")
            tensors.pop(theirs + "self_attn.in_proj_bias")
            d = weight.shape[1]
            for j, k in enumerate(_ATTENTION_ROWS):
                for leaf, value in (("kernel", weight[j * d:(j + 1) * d].T),
                                    ("bias", bias[j * d:(j + 1) * d])):
                    if attention + (k, leaf) in per_layer:
                        flat[attention + (k, leaf)] = _shaped(
                            value, per_layer[attention + (k, leaf)].shape)
        for module, name in _DETECTOR_MODULES:
            leaf = "kernel" if ours + module + ("kernel",) in per_layer else "scale"
            put(ours + module + (leaf,), f"{theirs}{name}.weight",
                np.transpose if leaf == "kernel" else (lambda v: v))
            put(ours + module + ("bias",), f"{theirs}{name}.bias")
    return _stack_complete(flat, expected), sorted(tensors)


def _shaped(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` in ``shape`` where it has as many elements (else as it is, for the caller's
    shape check)."""
    return value.reshape(shape) if value.size == int(np.prod(shape)) else value


def _heads_from_torch(tensors: dict, per_layer: Mapping[Path_, Any], flat: dict,
                      num_classes: tuple[int, ...]) -> None:
    """The 2 x A heads -> the stacked state heads (out_proj padded with zero columns)."""
    width = per_layer[HEADS + ("out_proj", "kernel")].shape[-1]
    heads = [(f"{g}.{a}.", n) for g in HEAD_GROUPS for a, n in enumerate(num_classes)]
    names = [f"{head}{m}.{leaf}" for head, _ in heads for m in ("dense", "out_proj")
             for leaf in ("weight", "bias")]
    if not all(n in tensors for n in names):
        return
    stacks: dict[Path_, list[np.ndarray]] = {}
    for head, n in heads:
        kernel = tensors[head + "out_proj.weight"].T
        if kernel.shape[1] != n:
            raise ValueError(f"{head}out_proj has {kernel.shape[1]} classes; its attribute has "
                             f"{n}")
        for path, value in ((("dense", "kernel"), tensors[head + "dense.weight"].T),
                            (("dense", "bias"), tensors[head + "dense.bias"]),
                            (("out_proj", "kernel"), np.pad(kernel, ((0, 0), (0, width - n)))),
                            (("out_proj", "bias"),
                             np.pad(tensors[head + "out_proj.bias"], (0, width - n)))):
            stacks.setdefault(HEADS + path, []).append(value)
    for name in names:
        tensors.pop(name)
    flat.update({path: np.stack(values) for path, values in stacks.items()})


def _stack_complete(flat: Mapping[Path_, np.ndarray], expected: Mapping[Path_, Any]
                    ) -> dict[Path_, np.ndarray]:
    """``flat`` (per layer) stacked onto the paths of ``expected``; a stacked parameter some
    layer of which is missing is left out."""
    out = {}
    for path, leaf in expected.items():
        found = _stacked(path)
        if found is None:
            if path in flat:
                out[path] = flat[path]
            continue
        stacked, rest = found
        layers = [_layer_path(stacked, i, rest) for i in range(leaf.shape[0])]
        if all(p in flat for p in layers):
            out[path] = np.stack([flat[p] for p in layers])
    return out
