"""Device mesh and partition rules: one place that says where every array lives.

The mesh has two axes: ``data`` and ``fsdp``. Batches are split over both (every device gets
its own pairs and encoder rows); parameters and optimizer state are sharded over ``fsdp`` when
they are large (at least ``fsdp_min_size`` elements: the encoder's embedding and weight
matrices, the stacked state heads), on their largest dimension that ``fsdp`` divides, and
replicated otherwise (biases, LayerNorms). ``data=N, fsdp=1`` is plain data parallelism;
``data=1, fsdp=N`` is fully sharded data parallelism. The rule depends on shapes only, so it
covers any encoder and the optimizer state (Adam moments mirror the parameters).

Multi-process: each process builds the contiguous share of every global batch that its devices
hold, one piece per device (``trip_jax.data.batching``, the layouts), and ``global_batch``
assembles the shares into global arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from trip_jax.batch_contract import INDEX_SPACES

MESH_AXES: tuple[str, ...] = ("data", "fsdp")
# The batch's leading dimension is split over every device.
BATCH_AXES: tuple[str, ...] = ("data", "fsdp")


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int]:
    """The (data, fsdp) sizes of ``mesh_config`` over ``num_devices`` devices; one size may be
    -1 (every device the other axis leaves). ValueError when they do not fit the devices."""
    sizes = {"data": int(mesh_config.data), "fsdp": int(mesh_config.fsdp)}
    free = [axis for axis, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError("at most one mesh axis may be -1 (all remaining devices)")
    if free:
        other = int(np.prod([s for a, s in sizes.items() if a not in free]))
        if other < 1 or num_devices % other:
            raise ValueError(f"mesh {sizes}: {num_devices} devices are not divisible by {other}")
        sizes[free[0]] = num_devices // other
    if any(s < 1 for s in sizes.values()) or sizes["data"] * sizes["fsdp"] != num_devices:
        raise ValueError(f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} does not match the "
                         f"{num_devices} devices; set --config.mesh.data / --config.mesh.fsdp")
    return sizes["data"], sizes["fsdp"]


def create_mesh(mesh_config, devices=None) -> Mesh:
    """Returns the ("data", "fsdp") mesh of ``mesh_config`` (sizes; one of them may be -1)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    return Mesh(mesh_utils.create_device_mesh(shape, devices), MESH_AXES)


def num_batch_shards(mesh: Mesh) -> int:
    """Number of pieces the batch's leading dimension is split into."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def local_batch_shards(mesh: Mesh) -> int:
    """Number of pieces of the batch's leading dimension that this process's devices hold."""
    return num_batch_shards(mesh) // jax.process_count()


def param_spec(shape: tuple[int, ...], fsdp_size: int, min_size: int) -> P:
    """Partition spec of one parameter (or optimizer-state) array: see the module docstring."""
    if fsdp_size == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: (-shape[d], d)):
        if shape[dim] % fsdp_size == 0:
            spec = [None] * len(shape)
            spec[dim] = "fsdp"
            return P(*spec)
    return P()


def tree_shardings(mesh: Mesh, tree: Any, min_size: int) -> Any:
    """NamedShardings for every array of ``tree`` (parameters, a TrainState, abstract or real)."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(x.shape, fsdp, min_size)), tree)


def replicated(mesh: Mesh) -> NamedSharding:
    """A sharding that puts the whole array on every device."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of every Batch array: leading dimension split over all devices (also usable as
    the sharding of a whole Batch dict, whatever its keys)."""
    return NamedSharding(mesh, P(BATCH_AXES))


def _local_block(sharding: NamedSharding, global_shape: tuple[int, ...]) -> tuple[int, int]:
    """The [start, stop) rows of the leading dimension that this process's devices hold."""
    slices = [index[0] for index in sharding.addressable_devices_indices_map(global_shape).values()]
    start = min(s.start or 0 for s in slices)
    stop = max(global_shape[0] if s.stop is None else s.stop for s in slices)
    return start, stop


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each process's share of a batch into global arrays split over the mesh.

    ``local_batch`` holds this process's contiguous share of the global batch (B_local pairs and
    their encoder arrays, built by the layout in one piece per local device, so every leading
    dimension splits over them). Each index array of the contract (``INDEX_SPACES``: cells,
    tracks, tokens) is moved from the share's space to the global one; its padding entries
    point past the global end. With one process this is a sharded ``device_put``.
    """
    sharding = batch_sharding(mesh)
    shards = num_batch_shards(mesh)
    local_shards = shards // jax.process_count()
    pairs = local_batch["pair_mask"].shape[0]
    if pairs % local_shards:
        raise ValueError(f"{pairs * jax.process_count()} pairs per batch do not split over "
                         f"{shards} devices; use a batch size divisible by {shards}")
    uneven = sorted(k for k, v in local_batch.items() if v.shape[0] % local_shards)
    if uneven:
        raise ValueError(f"{', '.join(uneven)} of this process's batch do not split over its "
                         f"{local_shards} devices; build the batch in that many pieces "
                         "(input_pipeline.batch_stream(shards=...))")
    global_pairs = pairs * jax.process_count()
    first, last = _local_block(sharding, (global_pairs,))
    if last - first != pairs:
        raise ValueError(f"this process's devices hold pairs [{first}, {last}) of the global "
                         f"batch, but it built {pairs} pairs")
    cells = int(np.prod(local_batch["row_mask"].shape[1:]))  # 2 * E * S per pair
    sequences, length = local_batch["input_ids"].shape
    first_sequence = _local_block(sharding, (sequences * jax.process_count(),))[0]
    # (size of this share's space, where it starts in the global one, the global size)
    spaces = {"cells": (pairs * cells, first * cells, global_pairs * cells),
              "tracks": (pairs * (cells // local_batch["row_mask"].shape[-1]),
                         first * (cells // local_batch["row_mask"].shape[-1]),
                         global_pairs * (cells // local_batch["row_mask"].shape[-1])),
              "tokens": (sequences * length, first_sequence * length,
                         sequences * length * jax.process_count())}
    batch = dict(local_batch)
    for key, value in local_batch.items():
        if key in INDEX_SPACES:
            size, start, end = spaces[INDEX_SPACES[key]]
            index = value.astype(np.int64)
            batch[key] = np.where(index < size, index + start, end).astype(np.int32)
    result = {}
    for key, value in batch.items():
        global_shape = (value.shape[0] * jax.process_count(),) + value.shape[1:]
        result[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return result
