"""The train state: its type, its shapes and shardings, and where its parameters come from.

``create_train_state`` initialises (step 0, fresh or pretrained encoder parameters, the
optimizer's state) directly in the shardings of ``trip_jax.runtime.sharding.tree_shardings``;
``init_params_from`` takes parameters from another run's checkpoint (``train.init_from``).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from flax import traverse_util

from trip_jax.models import builders, param_names
from trip_jax.runtime import sharding
from trip_jax.training import checkpoints


def _name(path: tuple[str, ...]) -> str:
    """A flat path as ``jax.tree_util.keystr`` names it: ``['detector']['layer_0']...``."""
    return "".join(f"[{k!r}]" for k in path)


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training: step counter, parameters, optimizer state."""

    step: jax.Array
    params: Any
    opt_state: Any


def _check_encoder_params(expected, given, source: str) -> None:
    """Raises a clear error when pretrained encoder parameters do not fit the model."""
    def shapes(tree):
        return {jax.tree_util.keystr(k): tuple(np.shape(v))
                for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    want, got = shapes(expected), shapes(given)
    bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if bad:
        raise ValueError(f"encoder weights from {source!r} do not fit the model: "
                         + "; ".join(f"{k}: model {want.get(k)}, weights {got.get(k)}"
                                     for k in bad[:8]))


def _init_fn(config, model, tx) -> Callable:
    """``init(rng, encoder_params or None) -> TrainState`` (traced: under jit or eval_shape)."""
    max_sentences = config.data.max_sentences

    def init(rng, encoder):
        params = builders.init_params(model, rng, max_sentences)
        if encoder is not None:
            params = {**params, "encoder": encoder}
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params))

    return init


def abstract_train_state(config, model, tx: optax.GradientTransformation, mesh
                         ) -> tuple[TrainState, Any]:
    """Shapes and shardings of the train state, computed without allocating it."""
    abstract = jax.eval_shape(_init_fn(config, model, tx), jax.random.key(0), None)
    return abstract, sharding.tree_shardings(mesh, abstract, config.mesh.fsdp_min_size)


def jitted_init(config, model, tx: optax.GradientTransformation, shardings) -> Callable:
    """``init(rng, encoder_params or None) -> TrainState``, jitted to give the state in
    ``shardings`` (``abstract_train_state``'s)."""
    return jax.jit(_init_fn(config, model, tx), out_shardings=shardings)


def create_train_state(config, model, tx: optax.GradientTransformation, mesh,
                       encoder_params=None, abstract_and_shardings=None, init=None
                       ) -> tuple[TrainState, Any]:
    """Initialises the train state directly in its shardings; returns (state, shardings).

    ``encoder_params`` (pretrained, host arrays) replace the random encoder initialisation;
    ``abstract_and_shardings``: ``abstract_train_state``'s result for these arguments, and
    ``init``: ``jitted_init``'s, if already built.
    """
    abstract, shardings = (abstract_and_shardings
                           or abstract_train_state(config, model, tx, mesh))
    if encoder_params is not None:
        _check_encoder_params(abstract.params["encoder"], encoder_params, config.model.encoder)
    init = init or jitted_init(config, model, tx, shardings)
    return init(jax.random.key(config.train.seed), encoder_params), shardings


def init_params_from(config, params):
    """Returns ``params`` with every parameter taken from the checkpoint
    ``train.init_from_checkpoint`` of the run in ``train.init_from`` whose path (e.g.
    ``['detector']['conflict_out']['kernel']``) does not match the regex ``train.init_skip``
    and that the earlier run's model has; the others keep their fresh initialisation (logged).
    Layers count one by one (``['detector']['layer_1']...``, ``param_names``): a run with more
    layers takes the earlier run's and initialises the rest.

    Another encoder or tokenizer, or a parameter whose shape differs from the earlier run's, is
    an error; another data split (protocol, held-out slice) is a warning, since the earlier run
    may have trained on this run's selection pairs. The earlier run's parameters land on the
    shardings of ``params``; the optimizer state stays fresh.
    """
    train_config = config.train
    source = checkpoints.restore_for_eval(train_config.init_from,
                                          train_config.init_from_checkpoint)
    for key in ("encoder", "tokenizer"):
        theirs, ours = getattr(source.config.model, key), getattr(config.model, key)
        if theirs != ours:
            raise ValueError(f"train.init_from: {train_config.init_from} was trained with "
                             f"model.{key}={theirs!r}, this run has {ours!r}")
    split_keys = ("data_dir", "protocol", "holdout_fraction", "holdout_seed", "folds", "fold",
                  "max_pairs")
    changed = [k for k in split_keys
               if getattr(source.config.data, k) != getattr(config.data, k)]
    if changed:
        logging.warning("train.init_from: %s used other data settings (%s): it may have trained "
                        "on this run's selection pairs", train_config.init_from,
                        ", ".join(f"data.{k}={getattr(source.config.data, k)!r}"
                                  for k in changed))
    # Parameter by parameter and layer by layer (param_names: the per-layer view), so that a
    # run with more layers takes the earlier run's and initialises the others.
    loaded = {_name(p): v for p, v in param_names.unstack_layers(
        traverse_util.flatten_dict(source.params)).items()}
    skip = re.compile(train_config.init_skip) if train_config.init_skip else None
    taken, fresh = [], []

    def pick(path, shape):
        """The earlier run's value of the parameter (or layer) at ``path``, or None."""
        name = _name(path)
        if name not in loaded or (skip is not None and skip.search(name)):
            fresh.append(name)
            return None
        if np.shape(loaded[name]) != tuple(shape):
            raise ValueError(f"train.init_from: {name} has shape {np.shape(loaded[name])} in "
                             f"{train_config.init_from} but {tuple(shape)} in this model")
        taken.append(name)
        return loaded[name]

    def place(path, leaf):
        layers = param_names.layer_paths(path, leaf.shape[0] if leaf.ndim else 0)
        if layers is None:
            value = pick(path, leaf.shape)
            return leaf if value is None else jax.device_put(value.astype(leaf.dtype),
                                                             leaf.sharding)
        sharding = leaf.sharding
        for i, layer in enumerate(layers):  # on the devices: fresh layers are never fetched
            value = pick(layer, leaf.shape[1:])
            if value is not None:
                leaf = leaf.at[i].set(jnp.asarray(value, leaf.dtype))
        return jax.device_put(leaf, sharding)

    params = traverse_util.unflatten_dict(
        {p: place(p, v) for p, v in traverse_util.flatten_dict(params).items()})
    # One entry per top-level group: "detector (18)" rather than 18 paths.
    groups = collections.Counter(name.split("]")[0] + "]" for name in fresh)
    logging.info("train.init_from: %d parameters from %s (%s checkpoint, step %d, protocol "
                 "%s); freshly initialised: %s", len(taken), train_config.init_from,
                 source.kind, source.step, source.meta.get("protocol"),
                 ", ".join(f"{g} ({n})" for g, n in groups.items()) or "none")
    return params
