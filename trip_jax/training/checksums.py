"""Checksums of the arrays a checkpoint holds, to tell intact weights from damaged ones.

``tree_checksums(tree)`` maps each array's tree path to ``"DTYPE[SHAPE]:HEX"``, computed where
the array lives and independent of sharding and platform; ``meta_checksum`` hashes the metadata.
Details: docs/reference.md#training ("Verified checkpoints").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding):
            replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
            break
    if replicated not in _JITTED:
        _JITTED[replicated] = jax.jit(_tree_sums, out_shardings=replicated)
    return _JITTED[replicated]


def _describe(x: Any) -> str:
    return f"{np.dtype(x.dtype).name}[{','.join(str(d) for d in x.shape)}]"


def tree_checksums(tree: Any) -> dict[str, str]:
    """``{tree path: "DTYPE[SHAPE]:HEX"}`` for every array leaf of ``tree`` (module docstring);
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
