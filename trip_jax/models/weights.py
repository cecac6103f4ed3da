"""Hugging Face checkpoints (msgpack / safetensors / PyTorch .bin) -> Flax encoder parameters.

Conversion is by renaming, guided by the encoder's expected per-layer tree, then stacking the
layers (``param_names``); a family that needs more declares a ``convert`` hook
(``encoder_registry.Family``). Details: docs/reference.md#hand-written-parts-and-why.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util

from trip_jax import encoder_registry as registry
from trip_jax.encoder_registry import MODEL_TYPES, Checkpoint, Path_, build_encoder
from trip_jax.models import param_names
from trip_jax.runtime import hub, pypi_copies

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
FLAX_WEIGHTS = "flax_model.msgpack"
# Weight files in order of preference: (single file, index of a sharded checkpoint).
WEIGHT_FILES = (
    ("model.safetensors", "model.safetensors.index.json"),
    (FLAX_WEIGHTS, None),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
)
# The files of one format fetched from the hub: single file, index and shards.
_HUB_PATTERNS = (
    ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"],
    [FLAX_WEIGHTS],
    ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"],
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_MAX_LISTED = 8


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a conversion did: parameters filled from the checkpoint, left missing, tensors
    unused."""

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unused: tuple[str, ...]


def load_pretrained(name_or_path: str | Path, *, dtype=jnp.float32, strict: bool = True,
                    seed: int = 0, cache_dir: str | Path | None = None,
                    flag: str = "--config.model.encoder"):
    """Loads a Hugging Face encoder checkpoint as ``(hf_config, params)`` for ``build_encoder``.

    ``name_or_path``: a local directory holding config.json and one of model.safetensors,
    flax_model.msgpack or pytorch_model.bin (sharded ones too), or a hub name such as
    ``roberta-large`` (the local cache first, then the hub once: ``trip_jax.runtime.hub``, whose
    one-line ``HubUnavailableError`` names ``flag`` as the way to pass a directory).
    ``dtype``: dtype of the returned (numpy) parameter arrays. Tensors outside the encoder (pooler,
    heads, buffers) are logged as unused. A shape mismatch always raises; with ``strict`` a missing
    parameter or a tensor inside the encoder that the config has no place for (e.g. an extra layer)
    raises too, otherwise missing ones are initialised from ``seed`` and logged.
    """
    directory = resolve_model_dir(name_or_path, cache_dir=cache_dir, flag=flag)
    hf_config = load_config(directory)
    checkpoint, source = read_checkpoint(directory)
    family = registry.family_of(hf_config.model_type)
    if family.convert is not None:  # names the Flax module cannot mirror
        checkpoint = family.convert(checkpoint)
    expected = expected_params(hf_config)
    flat, report = convert_checkpoint(
        checkpoint, expected, dtype=dtype, strict=strict, source=source,
        ignore_unexpected=family.ignore_unexpected)
    if report.missing:
        fresh = param_names.unstack_layers(
            traverse_util.flatten_dict(jax.device_get(_init_params(hf_config, seed))))
        flat.update({k: np.asarray(fresh[k], dtype)
                     for k in (tuple(n.split("/")) for n in report.missing)})
    return hf_config, traverse_util.unflatten_dict(param_names.stack_layers(flat))


def resolve_model_dir(name_or_path: str | Path, *, cache_dir: str | Path | None = None,
                      flag: str = "--config.model.encoder") -> Path:
    """Returns the local directory for ``name_or_path``: itself, a hub name's installed PyPI copy
    (``pypi_copies``), or its snapshot from the local cache or, when that lacks it, from the hub
    (``hub.fetch``)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(
            f"{path} is a file; pass the directory that holds {CONFIG_FILE} and the weights")
    name = str(name_or_path)
    copy = pypi_copies.local_copy(name)
    if copy is not None:
        return copy
    if not _HUB_ID.match(name) or ".." in name:
        raise FileNotFoundError(
            f"model directory {path} does not exist; pass a directory holding {CONFIG_FILE} and "
            f"one of {', '.join(f for f, _ in WEIGHT_FILES)}")
    return hub.fetch(name, lambda local_files_only: _download(name, cache_dir, local_files_only),
                     flag=flag, cache=None if cache_dir is None else str(cache_dir))


def _download(name: str, cache_dir, local_files_only: bool) -> Path:
    """config.json and the first weight format the hub repo has, from the local cache only
    (``local_files_only``) or from the hub."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        for patterns in _HUB_PATTERNS:
            directory = Path(snapshot_download(
                name, allow_patterns=[CONFIG_FILE, *patterns], cache_dir=cache_dir,
                local_files_only=local_files_only))
            if _weight_file(directory) is not None:
                return directory
    except (OSError, HFValidationError) as err:
        raise FileNotFoundError(
            f"could not load {name!r}: it is not a local directory, and fetching it from the "
            f"Hugging Face Hub failed ({type(err).__name__}: {str(err).splitlines()[0]}). "
            f"To provide the weights without network access, download them on a machine that has "
            f"it (`hf download {name} --local-dir DIR`, or "
            f"`transformers.AutoModel.from_pretrained({name!r}).save_pretrained(DIR)`), copy DIR "
            f"here and pass its path instead of the hub name. DIR must hold {CONFIG_FILE} and one "
            f"of {', '.join(f for f, _ in WEIGHT_FILES)}.") from err
    if local_files_only:
        raise FileNotFoundError(f"{name!r} is cached without weights")
    raise FileNotFoundError(f"hub repo {name!r} has no weights in a supported format "
                            f"({', '.join(f for f, _ in WEIGHT_FILES)})")


def load_config(directory: str | Path):
    """Reads ``config.json`` as a transformers config, refusing model types with no encoder here."""
    from transformers import AutoConfig

    config_path = Path(directory) / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: a model directory needs {CONFIG_FILE}")
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unknown architecture model_type={model_type!r} in {config_path}; "
            f"supported: {', '.join(MODEL_TYPES)}")
    return AutoConfig.from_pretrained(str(directory))


def _weight_file(directory: Path) -> Path | None:
    for single, index in WEIGHT_FILES:
        for name in (single, index):
            if name is not None and (directory / name).is_file():
                return directory / name
    return None


def read_checkpoint(directory: str | Path) -> tuple[Checkpoint, str]:
    """Reads the preferred weight file of ``directory`` as ``({path tuple: array}, file path)``."""
    directory = Path(directory)
    found = _weight_file(directory)
    if found is None:
        raise FileNotFoundError(
            f"no weights in {directory}: expected one of "
            f"{', '.join(f for f, _ in WEIGHT_FILES)} (or a sharded .index.json)")
    if found.name.endswith(".index.json"):
        shards = sorted(set(json.loads(found.read_text())["weight_map"].values()))
        checkpoint: Checkpoint = {}
        for shard in shards:
            checkpoint.update(_read_file(directory / shard))
        return checkpoint, str(found)
    return _read_file(found), str(found)


def _read_file(path: Path) -> Checkpoint:
    if path.suffix == ".msgpack":
        tree = serialization.msgpack_restore(path.read_bytes())
        return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file
        return {tuple(k.split(".")): v for k, v in load_file(str(path)).items()}
    if path.suffix == ".bin":
        return {tuple(k.split(".")): v for k, v in _read_torch_bin(path).items()}
    raise ValueError(f"unsupported weight file {path}")


def _read_torch_bin(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch  # only PyTorch pickles need torch
    except ImportError as err:
        raise ImportError(f"reading {path} needs torch (pip install torch); a model.safetensors "
                          f"copy of the weights loads without it") from err
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    # numpy has no bfloat16 conversion from torch; float32 holds bfloat16 values exactly.
    return {k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy()
            for k, v in state.items()}


def _init_inputs():
    ids = jnp.zeros((1, 8), jnp.int32)
    return ids, jnp.ones_like(ids)


def expected_params(hf_config) -> dict[Path_, jax.ShapeDtypeStruct]:
    """The flat parameter shapes of the encoder ``build_encoder(hf_config)`` (layers stacked),
    without computing them."""
    module = build_encoder(hf_config)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *_init_inputs()))
    return traverse_util.flatten_dict(shapes["params"])


def _init_params(hf_config, seed: int):
    # Jitted: op-by-op initialisation of a whole encoder is much slower than compiling it.
    return jax.jit(build_encoder(hf_config).init)(jax.random.key(seed), *_init_inputs())["params"]


def _base_prefix(checkpoint: Checkpoint, expected: Mapping[Path_, object]) -> str | None:
    """The first key component (e.g. "bert") whose removal makes the most tensors match, if any."""
    top = {k[0] for k in expected}
    scores: dict[str, int] = {}
    for path in checkpoint:
        if len(path) > 1 and path[0] not in top and param_names.encoder_match(path[1:],
                                                                               expected):
            scores[path[0]] = scores.get(path[0], 0) + 1
    return max(scores, key=scores.get) if scores else None


def _name(path: Path_, source: str) -> str:
    return "/".join(path) if source.endswith(".msgpack") else ".".join(path)


def _listing(names) -> str:
    names = list(names)
    more = f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def convert_checkpoint(checkpoint: Checkpoint, expected: Mapping[Path_, jax.ShapeDtypeStruct], *,
                       dtype=jnp.float32, strict: bool = True, source: str = "checkpoint",
                       ignore_unexpected: tuple[str, ...] = ()):
    """Renames ``checkpoint`` tensors onto the ``expected`` flat tree (layers stacked, as
    ``expected_params`` gives it); returns (flat params per layer, Hugging Face's paths:
    ``param_names.stack_layers`` stacks them; LoadReport, per-layer names).

    Raises ValueError naming the key for a shape mismatch, for two tensors filling one parameter,
    when nothing matches, and (``strict``) for missing parameters or for tensors inside the
    encoder's own modules that the config has no place for. ``source`` names the file in messages.
    Tensors without a place whose path holds a name in ``ignore_unexpected`` count as unused.
    """
    expected = param_names.unstack_layers(expected)
    checkpoint = param_names.unstack_layers(checkpoint)  # a stacked msgpack reads too
    prefix = _base_prefix(checkpoint, expected)
    top = {k[0] for k in expected}
    flat: dict[Path_, np.ndarray] = {}
    origin: dict[Path_, str] = {}
    unused, misplaced, mismatched = [], [], []
    for path, value in checkpoint.items():
        name = _name(path, source)
        stripped = path[1:] if prefix is not None and path[0] == prefix else path
        hit = param_names.encoder_match(stripped, expected)
        if hit is None:
            floating = np.issubdtype(value.dtype, np.floating) or value.dtype == jnp.bfloat16
            # Integer buffers (position_ids) and modules outside the encoder (pooler, heads) are
            # harmless; a float tensor inside the encoder's own modules means another architecture.
            inside = floating and stripped[0] in top
            ignored = any(part in ignore_unexpected for part in stripped)
            (misplaced if inside and not ignored else unused).append(name)
            continue
        target, transform = hit
        if target in flat:
            raise ValueError(f"{source}: tensors {origin[target]!r} and {name!r} both map to "
                             f"parameter {'/'.join(target)}")
        value = transform(value) if transform is not None else value
        want = tuple(expected[target].shape)
        if tuple(value.shape) != want:
            mismatched.append(f"{name} as {'/'.join(target)}: has {tuple(value.shape)}, "
                              f"expects {want}")
            continue
        flat[target] = np.asarray(value, dtype=dtype)
        origin[target] = name
    if mismatched:
        raise ValueError(
            f"{source}: shape mismatch between checkpoint tensors (shapes after conversion) and "
            f"the model built from the config: {_listing(mismatched)}; does config.json belong "
            f"to these weights?")
    if not flat:
        raise ValueError(
            f"{source}: architecture mismatch: none of its {len(checkpoint)} tensors "
            f"(e.g. {_listing(_name(p, source) for p in list(checkpoint)[:3])}) is a parameter of "
            f"this encoder (which expects e.g. "
            f"{_listing('/'.join(p) for p in list(expected)[:3])})")
    missing = sorted("/".join(p) for p in expected if p not in flat)
    if strict and misplaced:
        raise ValueError(
            f"{source}: architecture mismatch: tensors inside the encoder that the model built "
            f"from the config has no parameter for: {_listing(misplaced)}")
    if strict and missing:
        raise ValueError(f"{source}: missing parameters (the checkpoint does not match the "
                         f"config's architecture): {_listing(missing)}")
    if missing:
        logger.warning("%s: %d parameters missing, initialised fresh: %s",
                       source, len(missing), _listing(missing))
    unused = sorted(unused + misplaced)
    if unused:
        logger.warning("%s: %d tensors unused (not part of the encoder): %s",
                       source, len(unused), _listing(unused))
    report = LoadReport(loaded=tuple(sorted("/".join(p) for p in flat)),
                        missing=tuple(missing), unused=tuple(unused))
    return flat, report


def save_params(path: str | Path, params) -> None:
    """Writes ``params`` (a nested dict of arrays) to ``path`` as Flax msgpack."""
    host = jax.device_get(serialization.to_state_dict(params))
    Path(path).write_bytes(serialization.msgpack_serialize(host))


def load_params(path: str | Path):
    """Reads parameters written by ``save_params``, bit for bit."""
    return serialization.msgpack_restore(Path(path).read_bytes())


def save_pretrained(directory: str | Path, hf_config, params) -> Path:
    """Writes config.json and flax_model.msgpack (per layer, as Hugging Face's Flax models have
    it) so that ``load_pretrained(directory)`` re-reads them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(str(directory))
    flat = traverse_util.flatten_dict(jax.device_get(params))
    save_params(directory / FLAX_WEIGHTS,
                traverse_util.unflatten_dict(param_names.unstack_layers(flat)))
    return directory
