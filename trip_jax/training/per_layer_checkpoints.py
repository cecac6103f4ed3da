"""Checkpoints saved before the layers were stacked (issue 42): read per layer, then stacked.

``restore_per_layer`` reads a step whose parameters carry per-layer names, verifies them
against its checksums and stacks them (and the optimizer state) onto the current model's tree
through the name table of ``trip_jax/models/param_names.py``. Details: docs/reference.md#training.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import traverse_util

from trip_jax.models import param_names
from trip_jax.runtime import sharding
from trip_jax.training.checkpoint_reads import (CheckpointError, one_line, restore_items,
                                                saved_param_shapes, verify_arrays)


def restore_per_layer(manager: ocp.CheckpointManager, step: int, meta: dict, abstract,
                      shardings, *, init_opt_state: Callable | None = None,
                      abstract_opt_state=None):
    """(params, opt_state) of a checkpoint saved before the layers were stacked (per-layer
    names, ``param_names``): the parameters read as saved, verified, stacked through the name
    table and placed on ``shardings``; CheckpointError in one line when they do not stack onto
    ``abstract``. The optimizer state is None without ``init_opt_state`` (the optimizer's
    ``init``); with it, it is read in the layout ``init_opt_state`` gives the saved per-layer
    parameters, verified, and stacked leaf by leaf onto ``abstract_opt_state`` (host arrays).
    """
    where = epath.Path(manager.directory) / str(step)
    mesh = jax.tree.leaves(shardings)[0].mesh
    replicated = sharding.replicated(mesh)
    saved = traverse_util.unflatten_dict(
        {p: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=replicated)
         for p, m in saved_param_shapes(manager, step).items()})
    items = {"params": ocp.args.StandardRestore(saved)}
    if init_opt_state is not None:
        old_opt_state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
            jax.eval_shape(init_opt_state, saved))
        items["opt_state"] = ocp.args.StandardRestore(old_opt_state)
    restored = restore_items(manager, step, **items)
    verify_arrays(meta, str(where), **{name: restored[name] for name in items})
    try:
        stacked = param_names.stack_layers(
            traverse_util.flatten_dict(jax.device_get(restored.params)))
    except ValueError as err:
        raise CheckpointError(f"checkpoint {where}: its per-layer parameters do not stack: "
                              f"{one_line(err)}") from None
    wanted = traverse_util.flatten_dict(abstract)
    differences = sorted(
        [f"{'/'.join(p)} missing" for p in wanted if p not in stacked]
        + [f"{'/'.join(p)} not in this model" for p in stacked if p not in wanted]
        + [f"{'/'.join(p)} has shape {stacked[p].shape}, this model {wanted[p].shape}"
           for p in wanted if p in stacked and stacked[p].shape != wanted[p].shape])
    if differences:
        raise CheckpointError(
            f"checkpoint {where} holds per-layer parameters (saved before layers were stacked) "
            f"that differ from this model's once stacked: {differences[0]}"
            + (f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""))
    logging.info("%s: parameters saved per layer (before layers were stacked), stacked on "
                 "reading", where)
    params = jax.device_put(traverse_util.unflatten_dict(
        {p: stacked[p].astype(wanted[p].dtype) for p in wanted}), shardings)
    if init_opt_state is None:
        return params, None
    return params, _stack_leaves(jax.device_get(restored.opt_state), abstract_opt_state)


def _components(path) -> tuple[str, ...]:
    """A pytree key path as strings: list indices, attribute names and dict keys alike."""
    return tuple(str(getattr(k, "idx", getattr(k, "name", getattr(k, "key", k))))
                 for k in path)


def _stack_leaves(old, abstract):
    """The tree ``abstract`` filled from ``old`` (the same tree with per-layer parameter
    paths): each leaf at a stacked path is its layers' leaves stacked (``param_names``)."""
    leaves = {_components(p): v for p, v in jax.tree_util.tree_flatten_with_path(old)[0]}

    def take(path, leaf):
        path = _components(path)
        layers = param_names.layer_paths(path, leaf.shape[0]) if leaf.shape else None
        return (leaves[path] if layers is None
                else np.stack([np.asarray(leaves[p]) for p in layers])).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(take, abstract)
