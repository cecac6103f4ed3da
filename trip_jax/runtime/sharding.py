"""Device mesh and partition rules: one place that says where every array lives.

A ``data`` x ``fsdp`` mesh: batches split over both, large parameters and optimizer state sharded
over ``fsdp`` on their largest divisible dimension (by shapes), the rest replicated; steps gather
them before use (``gathered``; docs/compile.md#fsdp, docs/reference.md#hand-written-parts-and-why).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from trip_jax.config.messages import bad_value

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
    """Returns the ("data", "fsdp") mesh of ``mesh_config`` (sizes; one of them may be -1) over
    ``devices`` (default: all), laid out on the TPU torus by ``mesh_utils``."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    try:
        grid = mesh_utils.create_device_mesh(shape, devices)
    except NotImplementedError:
        # A TPU torus whose sides do not multiply into the mesh's (v5e-256, 16x16, as 32 x 8):
        # the axes then split physical ones (found by --mode=compile, docs/compile.md).
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES)


def batch_shards(axis_sizes) -> int:
    """The pieces a batch's leading dimension is split into, for a mesh of ``axis_sizes``
    ({axis: size}): the product of the ``BATCH_AXES`` sizes."""
    return int(np.prod([axis_sizes[a] for a in BATCH_AXES]))


def check_batch_split(batch_size: int, axis_sizes) -> None:
    """ValueError, one line naming ``train.batch_size``, unless ``batch_size`` splits over the
    ``batch_shards`` of a mesh of ``axis_sizes`` ({axis: size}): every device gets its own pairs."""
    shards = batch_shards(axis_sizes)
    if batch_size % shards:
        mesh = " x ".join(f"{axis}={size}" for axis, size in dict(axis_sizes).items())
        raise ValueError(bad_value(
            "train.batch_size", batch_size,
            f"a multiple of {shards}, the devices the batch is split over: mesh {mesh}"))


def num_batch_shards(mesh: Mesh) -> int:
    """``batch_shards`` of ``mesh``."""
    return batch_shards(mesh.shape)


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


def gathered(params, mesh: Mesh):
    """``params`` whole on every device of ``mesh``, inside a jitted step (FSDP's gather before
    use; their gradients then leave reduced to each device's shard)."""
    return jax.lax.with_sharding_constraint(params, replicated(mesh))


def local_block(sharding: NamedSharding, global_shape: tuple[int, ...]) -> tuple[int, int]:
    """The [start, stop) rows of the leading dimension that this process's devices hold."""
    slices = [index[0] for index in sharding.addressable_devices_indices_map(global_shape).values()]
    start = min(s.start or 0 for s in slices)
    stop = max(global_shape[0] if s.stop is None else s.stop for s in slices)
    return start, stop
