"""Reading and verifying one saved checkpoint step, or one line naming what is damaged.

Checksums of its arrays and metadata, recorded at save (``with_checksums``), checked at read
(``verify_meta``, ``verify_arrays``); ``restore_items`` turns any orbax failure into a one-line
``DamagedCheckpointError``; its config (``saved_config``); per-layer checkpoints refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import traverse_util

from trip_jax.config import migrate
from trip_jax.config.messages import ConfigError
from trip_jax.config.sections import Config
from trip_jax.config.typed import as_dict, typed
from trip_jax.models import param_names
from trip_jax.runtime import terminal

CHECKSUMS = "checksums"  # the key of meta that holds the checksums


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or does not belong to the given config."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint's files cannot be read, or its arrays or metadata differ from the checksums
    recorded when it was saved. Its message is one line whatever text went into it (line breaks
    and runs of spaces become one space)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


# The most characters of a name read off a damaged checkpoint or an error's text shown.
NAME_LIMIT = 160


def one_line(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` on one line (whitespace runs -> one space), cut to ``limit`` characters with
    "..." (a name read off damaged files can be anything)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# In TensorStore's messages (which name neither clearly nor briefly): the array being read
# ('Error reading "params.x.kernel/.zarray"') and the local files involved.
_TS_ARRAY = re.compile(r'Error reading "([^"]+?)/\.z')
_TS_FILE = re.compile(r'local file "([^"]+)"')


def _causes(err: BaseException):
    """``err`` and the exceptions it was raised from or during, outermost first."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def unreadable_part(err: BaseException, where: epath.Path, items) -> str:
    """What of the checkpoint at ``where`` could not be read, in words: the array and the file
    a TensorStore error names (relative to ``where``), else the restored items' folders."""
    text = " ".join(str(e) for e in _causes(err))
    found = []
    array = _TS_ARRAY.search(text)
    if array:
        found.append(f"array {one_line(array.group(1))}")
    files = [f for f in _TS_FILE.findall(text) if not f.endswith("/")]
    if files:
        path = files[-1]
        prefix = str(where).rstrip("/") + "/"
        found.append(f"file {one_line(path[len(prefix):] if path.startswith(prefix) else path)}")
    if not found:
        found.append(" and ".join(f"{item}/" for item in items) + " folder")
    return ", ".join(found)


def _damaged(err: Exception, where: epath.Path, items) -> DamagedCheckpointError:
    """The one-line error for ``items`` of the checkpoint at ``where`` that ``err`` kept from
    being read; the full cause goes to the log at debug level."""
    logging.debug("reading %s (%s) failed", where, ", ".join(items), exc_info=err)
    terminal.note_aborted_read(where)  # the reads of its other arrays may still fail
    return DamagedCheckpointError(
        f"checkpoint {where} is damaged or unreadable: could not restore its "
        f"{unreadable_part(err, where, items)} (the cause is logged at debug level, "
        "--verbosity=1)")


def read_meta(manager: ocp.CheckpointManager, step: int, where: str,
              config: Config | None = None) -> tuple[dict, Config]:
    """(meta, its saved config) of one step, verified (``verify_meta``); with ``config``,
    CheckpointError when the step belongs to another model (``check_compatible``)."""
    meta = restore_items(manager, step, meta=ocp.args.JsonRestore()).meta
    verify_meta(meta, where)
    if config is not None:
        check_compatible(meta["config"], config, where)
    return meta, saved_config(meta["config"], where)


def restore_items(manager: ocp.CheckpointManager, step: int, **items) -> Any:
    """Restores ``items`` (name -> orbax restore args) of one step; any failure is a one-line
    DamagedCheckpointError naming the checkpoint and the array or file it could not read."""
    where = epath.Path(manager.directory) / str(step)
    try:
        return manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as err:  # orbax raises many types for unreadable/mismatched data
        raise _damaged(err, where, items) from err


def saved_param_shapes(manager: ocp.CheckpointManager, step: int
                       ) -> dict[tuple[str, ...], Any]:
    """The flat tree of the saved parameters' metadata (shape, dtype) of ``step``; one-line
    DamagedCheckpointError when it cannot be read."""
    where = epath.Path(manager.directory) / str(step)
    try:
        tree = ocp.StandardCheckpointHandler().metadata(where / "params").tree
    except Exception as err:  # orbax raises many types for unreadable metadata
        raise _damaged(err, where, ["params"]) from err
    return traverse_util.flatten_dict(tree)


def with_checksums(meta: dict, **trees) -> dict:
    """``meta`` plus ``meta["checksums"]``: the checksums of ``meta`` itself and of every array
    of ``trees`` (item name -> tree), to save in the same checkpoint as those trees."""
    recorded = {name: tree_checksums(tree) for name, tree in trees.items()}
    return {**meta, CHECKSUMS: {"meta": meta_checksum(meta), **recorded}}


def _recorded(meta: dict) -> dict:
    """The checksums ``meta`` records ({} where that entry is not a mapping: damaged)."""
    recorded = meta.get(CHECKSUMS)
    return recorded if isinstance(recorded, dict) else {}


def verify_meta(meta: dict, where: str) -> bool:
    """Checks ``meta`` against its recorded checksum; False (with a warning) when it records
    none (a checkpoint saved before checksums were), DamagedCheckpointError on a mismatch."""
    if CHECKSUMS not in meta:
        logging.warning("checkpoint %s carries no checksums (saved before they were recorded): "
                        "its weights are used unverified", where)
        return False
    rest = {k: v for k, v in meta.items() if k != CHECKSUMS}
    saved, found = _recorded(meta).get("meta"), meta_checksum(rest)
    if saved != found:
        terminal.note_aborted_read(where)  # reads of it still under way are leftovers too
        raise DamagedCheckpointError(f"checkpoint {where} is damaged: its metadata has checksum "
                                     f"{found}, saved with {one_line(saved)}")
    return True


def verify_arrays(meta: dict, where: str, **trees) -> None:
    """Checks the arrays of ``trees`` (item name -> restored tree) against the checksums that
    ``meta`` records (nothing to check when it records none): DamagedCheckpointError naming
    the first array that differs and both checksums."""
    if CHECKSUMS not in meta:
        return
    for name, tree in trees.items():
        saved = _recorded(meta).get(name)
        mismatch = first_mismatch(saved if isinstance(saved, dict) else {},
                                  tree_checksums(tree))
        if mismatch is not None:
            path, saved, found = mismatch
            terminal.note_aborted_read(where)  # reads of it still under way are leftovers too
            raise DamagedCheckpointError(
                f"checkpoint {where} is damaged: {one_line(name + path)} has checksum "
                f"{one_line(found)}, saved with {one_line(saved)}")


# Checksums: ``tree_checksums(tree)`` maps each array's tree path to "DTYPE[SHAPE]:HEX", computed
# where the array lives, independent of sharding and platform (docs/reference.md#training,
# "Verified checkpoints").
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _words(x: jax.Array) -> jax.Array:
    """The raw bits of ``x`` as uint32 words (one per element; two for 8-byte dtypes)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = np.dtype(x.dtype).itemsize
    if size > 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # adds a trailing axis
    return jax.lax.bitcast_convert_type(x, _UINT[size]).astype(jnp.uint32)


def _mix(h: jax.Array) -> jax.Array:
    """A bijection of uint32 (murmur3's finaliser)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _sums(x: jax.Array) -> jax.Array:
    """Two uint32 sums over the elements of ``x``: of bits * (2i + 1), and of mix(bits + i*c)."""
    words = _words(x)
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(
            stride % 2**32)
        stride *= words.shape[axis]
    first = jnp.sum(words * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
    second = jnp.sum(_mix(words + index * jnp.uint32(0x9E3779B9)), dtype=jnp.uint32)
    return jnp.stack([first, second])


def _tree_sums(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_sums(x) for x in leaves]


_JITTED: dict[Any, Any] = {}


def _jitted(leaves: list[Any]):
    """``_tree_sums`` jitted to give its sums replicated over the leaves' mesh (readable on
    every process of a multi-process run)."""
    replicated = None
    for leaf in leaves:
        placed = getattr(leaf, "sharding", None)
        if isinstance(placed, jax.sharding.NamedSharding):
            replicated = jax.sharding.NamedSharding(placed.mesh, jax.sharding.PartitionSpec())
            break
    if replicated not in _JITTED:
        _JITTED[replicated] = jax.jit(_tree_sums, out_shardings=replicated)
    return _JITTED[replicated]


def _describe(x: Any) -> str:
    return f"{np.dtype(x.dtype).name}[{','.join(str(d) for d in x.shape)}]"


def tree_checksums(tree: Any) -> dict[str, str]:
    """``{tree path: "DTYPE[SHAPE]:HEX"}`` for every array leaf of ``tree`` (the comment above);
    leaves may be jax arrays (any sharding) or numpy arrays."""
    flat = jax.tree_util.tree_leaves_with_path(tree)
    leaves = [jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf for _, leaf in flat]
    sums = jax.device_get(_jitted(leaves)(leaves))
    return {jax.tree_util.keystr(path): f"{_describe(leaf)}:{int(s[0]):08x}{int(s[1]):08x}"
            for (path, leaf), s in zip(flat, sums, strict=True)}


def meta_checksum(meta: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``meta`` as canonical JSON (sorted keys): equal for a document and its
    JSON round trip."""
    text = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def first_mismatch(saved: Mapping[str, str], found: Mapping[str, str]
                   ) -> tuple[str, str | None, str | None] | None:
    """The first (path, saved checksum, found checksum) that differs (a path missing on one
    side has None there), or None when the two maps agree."""
    for path in sorted(set(saved) | set(found)):
        if saved.get(path) != found.get(path):
            return path, saved.get(path), found.get(path)
    return None


# A checkpoint's saved config: brought to the current schema, and held against the current one.
def saved_config(values: dict[str, Any], where: str) -> Config:
    """The typed config of a saved one (``meta["config"]`` of a checkpoint in ``where``),
    brought to the current schema (``trip_jax.config.migrate``); CheckpointError when no
    version reads it."""
    try:
        return typed(migrate.migrate(values, f"the config of {where}"))
    except ConfigError as err:
        raise CheckpointError(str(err)) from None


def _model_part(config: dict[str, Any]) -> dict[str, Any]:
    """The keys that decide the parameters' shapes and meaning."""
    return {"model": config["model"], "max_sentences": config["data"]["max_sentences"]}


def _differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == current else [f"{prefix[:-1]}: saved {saved!r}, now {current!r}"]


def check_compatible(saved: dict[str, Any], config: Config, where: str) -> None:
    """Raises CheckpointError when ``config`` describes another model than ``saved`` (a saved
    config, migrated to the current schema first)."""
    diffs = _differences(_model_part(as_dict(saved_config(saved, where))),
                         _model_part(as_dict(config)))
    if diffs:
        raise CheckpointError(
            f"the checkpoint in {where} was trained with a different model config:\n  "
            + "\n  ".join(diffs)
            + "\nUse a new --workdir, or the config the checkpoint was trained with.")


def refuse_per_layer(saved_shapes: Mapping[tuple[str, ...], Any], where: str) -> None:
    """CheckpointError in one line when ``saved_shapes`` (``saved_param_shapes``) name one
    layer per entry: a checkpoint saved before the layers were stacked (issue 42), whose reader
    went when no committed result under results/ needed it."""
    if param_names.per_layer_paths(saved_shapes):
        raise CheckpointError(
            f"checkpoint {where} holds per-layer parameters (saved before the layers were "
            "stacked), which this trip_jax no longer reads: train the run again, or read it "
            "with trip_jax e28b2fe or older")
