"""Device mesh and partition rules: one place that says where every array lives.

The mesh has two axes: ``data`` and ``fsdp``. Batches are split over both (every device gets
its own pairs and encoder rows); parameters and optimizer state are sharded over ``fsdp`` when
they are large (at least ``fsdp_min_size`` elements: the encoder's embedding and weight
matrices, the stacked state heads), on their largest dimension that ``fsdp`` divides, and
replicated otherwise (biases, LayerNorms). ``data=N, fsdp=1`` is plain data parallelism;
``data=1, fsdp=N`` is fully sharded data parallelism. The rule depends on shapes only, so it
covers any encoder and the optimizer state (Adam moments mirror the parameters).

Multi-process: each process builds the contiguous share of every global batch that its devices
hold (``trip_jax.data.batching``), and ``global_batch`` assembles the shares into global arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from trip_jax.batch_contract import is_packed_tokens, row_groups

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


def pad_rows(batch: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Pads the encoder rows of each row group of a packed batch to a multiple of ``multiple``.

    New rows attend to their first token only and point one past the end of the (B, 2, E, S)
    grid, so the model drops them.
    """
    padded = dict(batch)
    slots = int(np.prod(batch["row_mask"].shape))
    if is_packed_tokens(batch):
        return _pad_packed_tokens(padded, multiple, slots)
    for prefix in row_groups(batch):
        extra = -batch[prefix + "input_ids"].shape[0] % multiple
        if not extra:
            continue
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            value = batch[prefix + key]
            filler = np.zeros((extra,) + value.shape[1:], value.dtype)
            if key == "attention_mask":
                filler[:, 0] = 1
            padded[prefix + key] = np.concatenate([value, filler])
        index = batch[prefix + "row_index"]
        padded[prefix + "row_index"] = np.concatenate([index, np.full(extra, slots, index.dtype)])
    return padded


def _pad_packed_tokens(batch: dict[str, np.ndarray], multiple: int, slots: int
                       ) -> dict[str, np.ndarray]:
    """``pad_rows`` for the packed_tokens layout: sequences (all padding), rows (pointing past
    the grid) and tracks (past the tracks) each padded to a multiple of ``multiple``."""
    tracks = slots // batch["row_mask"].shape[-1]
    groups = ((("input_ids", "attention_mask", "token_type_ids", "segment_ids"), 0),
              (("row_start",), 0), (("row_index",), slots), (("track_index",), tracks))
    for keys, fill in groups:
        extra = -batch[keys[0]].shape[0] % multiple
        for key in keys:
            value = batch[key]
            filler = np.full((extra,) + value.shape[1:], fill, value.dtype)
            batch[key] = np.concatenate([value, filler])
    return batch


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each process's share of a batch into global arrays split over the mesh.

    ``local_batch`` holds this process's contiguous share of the global batch (B_local pairs and
    their rows, as ``trip_jax.data.batching`` builds it). Rows are padded to a multiple of the
    local device count, and each group's ``row_index`` (local to the share) is moved to the global
    (B, 2, E, S) grid. With one process this is a sharded ``device_put``.
    """
    sharding = batch_sharding(mesh)
    shards = num_batch_shards(mesh)
    local_shards = shards // jax.process_count()
    pairs = local_batch["pair_mask"].shape[0]
    if pairs % local_shards:
        raise ValueError(f"{pairs * jax.process_count()} pairs per batch do not split over "
                         f"{shards} devices; use a batch size divisible by {shards}")
    batch = pad_rows(local_batch, local_shards)
    global_pairs = pairs * jax.process_count()
    first, last = _local_block(sharding, (global_pairs,))
    if last - first != pairs:
        raise ValueError(f"this process's devices hold pairs [{first}, {last}) of the global "
                         f"batch, but it built {pairs} pairs")
    cells = int(np.prod(batch["row_mask"].shape[1:]))  # 2 * E * S per pair
    local_slots = pairs * cells
    if is_packed_tokens(batch):
        # Rows point at tokens of this process's sequences, tracks at its pairs' tracks.
        sequences, length = batch["input_ids"].shape
        first_sequence = _local_block(sharding, (sequences * jax.process_count(),))[0]
        batch["row_start"] = (batch["row_start"] + first_sequence * length).astype(np.int32)
        tracks = cells // batch["row_mask"].shape[-1]  # 2 * E per pair
        track_index = batch["track_index"].astype(np.int64)
        batch["track_index"] = np.where(track_index < pairs * tracks,
                                        track_index + first * tracks,
                                        global_pairs * tracks).astype(np.int32)
    for prefix in row_groups(batch) or [""]:
        row_index = batch[prefix + "row_index"].astype(np.int64)
        batch[prefix + "row_index"] = np.where(row_index < local_slots, row_index + first * cells,
                                               global_pairs * cells).astype(np.int32)
    result = {}
    for key, value in batch.items():
        global_shape = (value.shape[0] * jax.process_count(),) + value.shape[1:]
        result[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return result
