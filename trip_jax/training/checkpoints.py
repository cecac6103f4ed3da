"""Orbax checkpoints of a training run, and restoring a trained model with no training code.

A workdir holds ``checkpoints/{latest,selected,best_accuracy}/STEP`` beside its config and
tokenizer; restoring verifies the checksums (``checkpoint_reads``) and refuses a checkpoint
saved per layer. Details: docs/reference.md#training.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from flax import traverse_util

from trip_jax.models import builders
from trip_jax.runtime import paths, sharding
from trip_jax.training.checkpoint_reads import (CheckpointError, DamagedCheckpointError,
                                                read_meta, refuse_per_layer, restore_items,
                                                saved_config, saved_param_shapes, verify_arrays,
                                                with_checksums)
from trip_jax.config.sections import Config, MeshConfig
from trip_jax.config.typed import as_dict
from trip_jax.data.tokenizers import load_saved_tokenizer, save_tokenizer
from trip_jax.training.checkpoint_names import (BEST_ACCURACY, CHECKPOINTS_DIR, CONFIG_FILE,
                                                KINDS, LATEST, SELECTED, no_checkpoint)

RANKING: dict[str, tuple[str, ...]] = {
    # The selected checkpoint: the best selection score (trip_jax/training/selection.py),
    # then the tiers.
    SELECTED: ("selection_score", "verifiability", "consistency", "accuracy"),
    BEST_ACCURACY: ("accuracy", "consistency", "verifiability"),
}
# The selected checkpoint's folder before issue 25: refused, with the rename that reads it.
OLD_SELECTED = "best_verifiability"
_ITEMS = {LATEST: ("params", "opt_state", "meta"),
          SELECTED: ("params", "meta"), BEST_ACCURACY: ("params", "meta")}
ENCODER_CONFIG_FILE = "encoder_config.json"
TOKENIZER_DIR = "tokenizer"


# Latest checkpoints kept at least, so that a damaged newest one has an intact one behind it.
MIN_KEEP = 2


def write_run_files(workdir: str, config, hf_config, tokenizer) -> None:
    """Writes config.json, encoder_config.json and tokenizer/ into the workdir (process 0)."""
    if jax.process_index() != 0:
        return
    root = epath.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(root / CONFIG_FILE, json.dumps(as_dict(config), indent=2) + "\n")
    paths.write_atomic(root / ENCODER_CONFIG_FILE, hf_config.to_json_string())
    save_tokenizer(tokenizer, root / TOKENIZER_DIR)


def saved_run_config(workdir: str) -> Config:
    """The config a run saved as ``WORKDIR/config.json``, brought to the current schema;
    CheckpointError when it is missing or no version reads it."""
    path = epath.Path(workdir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: is {workdir} a trained workdir?")
    return saved_config(json.loads(path.read_text()), str(path))


def load_tokenizer(workdir: str):
    """Loads the tokenizer a run saved in its workdir."""
    source = epath.Path(workdir) / TOKENIZER_DIR
    if not source.is_dir():
        raise CheckpointError(f"{source} is missing: the workdir has no saved tokenizer")
    return load_saved_tokenizer(source)


def resolve_name(which: str | int) -> str | int:
    """The kind (``KINDS``) or step a checkpoint name means: a kind -> itself, a step number
    (int or digits) -> int; CheckpointError otherwise."""
    if which in KINDS:
        return which
    if isinstance(which, int) or (isinstance(which, str) and which.isdigit()):
        return int(which)
    raise CheckpointError(f"unknown checkpoint {which!r}; expected one of {KINDS} or a step")


def kind_directory(workdir: str, kind: str) -> epath.Path:
    """``WORKDIR/checkpoints/KIND``; CheckpointError where the selected checkpoint is only in
    its folder's name before issue 25 (``OLD_SELECTED``), naming the rename that reads it."""
    root = epath.Path(workdir) / CHECKPOINTS_DIR
    if kind == SELECTED and not (root / kind).is_dir() and (root / OLD_SELECTED).is_dir():
        raise CheckpointError(f"{root / OLD_SELECTED} is the selected checkpoint of a workdir "
                              f"older than this trip_jax reads; rename it {root / SELECTED}")
    return root / kind


def _manager(workdir: str, kind: str, *, keep: int | None = 1, async_save: bool = False,
             create: bool = True) -> ocp.CheckpointManager:
    # Each manager gets its own barrier key: several managers saving asynchronously in a
    # multi-process run would otherwise collide on orbax's shared barrier name.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=create, enable_async_checkpointing=async_save,
        multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=kind))
    return ocp.CheckpointManager(kind_directory(workdir, kind), options=options,
                                 item_names=_ITEMS[kind])


def _remove_unfinished(directory: epath.Path) -> None:
    """Removes the temporary step directories of saves a killed run left unfinished (process 0;
    only the training run, which holds the workdir lock, calls this)."""
    if jax.process_index() != 0 or not directory.is_dir():
        return
    for name in ocp.path.step.tmp_checkpoints(directory):
        logging.info("removing %s, a save a killed run left unfinished", directory / name)
        (directory / name).rmtree()


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def ranking_score(kind: str, scores: Mapping[str, Any]) -> tuple[float, ...]:
    """The tuple a best checkpoint of ``kind`` is ranked by (``RANKING``); scores without a
    selection score (runs saved before it existed) rank by verifiability first."""
    found = {"selection_score": scores.get("verifiability"), **scores}
    return tuple(float(found[key]) for key in RANKING[kind])


def _save_params(manager: ocp.CheckpointManager, step: int, params, saved_meta: dict) -> None:
    """Saves a params-and-meta checkpoint (``saved_meta`` already holds the checksums)."""
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                               meta=ocp.args.JsonSave(saved_meta)))


class RunCheckpoints:
    """The checkpoint managers of one training run (see the module docstring)."""

    def __init__(self, workdir: str, *, keep: int, async_save: bool):
        for kind in KINDS:  # kind_directory refuses an old workdir's selected/ folder
            _remove_unfinished(kind_directory(workdir, kind))
        # At least MIN_KEEP latest steps: a damaged newest one leaves an intact one to resume.
        self.managers = {LATEST: _manager(workdir, LATEST, keep=max(keep, MIN_KEEP),
                                          async_save=async_save)}
        for kind in RANKING:
            self.managers[kind] = _manager(workdir, kind, async_save=async_save)
        self._best = {kind: self._saved_score(kind) for kind in RANKING}

    def latest_step(self) -> int | None:
        """Step of the newest resumable checkpoint, or None."""
        return self.managers[LATEST].latest_step()

    def _saved_score(self, kind: str) -> tuple[float, ...] | None:
        manager = self.managers[kind]
        step = manager.latest_step()
        if step is None:
            return None
        meta, _ = read_meta(manager, step, str(epath.Path(manager.directory) / str(step)))
        if not meta["metrics"]:  # saved by save_final: ranks below any scored checkpoint
            return None
        return ranking_score(kind, meta["metrics"])

    def restore_latest(self, abstract_params, abstract_opt_state, param_shardings,
                       opt_shardings, config) -> tuple[Any, Any, dict]:
        """Restores (params, opt_state, meta) of the newest intact checkpoint onto the given
        shardings, verified against its checksums.

        A damaged step is reported in one warning line and removed once an older intact step
        is found. CheckpointError when there is no checkpoint, when none is intact (nothing is
        removed then), or when the newest belongs to another model config or was saved per
        layer (``refuse_per_layer``).
        """
        manager = self.managers[LATEST]
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise CheckpointError(f"no checkpoint to resume from in {manager.directory}")
        damaged = []
        for step in steps:
            try:
                restored = self._restore_latest_step(
                    step, _abstract(abstract_params, param_shardings),
                    _abstract(abstract_opt_state, opt_shardings), config)
            except DamagedCheckpointError as err:
                logging.warning("%s; %s", err, "trying the step before" if step != steps[-1]
                                else "no older checkpoint is left")
                damaged.append(step)
                continue
            for bad in damaged:
                manager.delete(bad)
            if damaged:
                logging.warning("resuming from step %d of %s, the newest intact checkpoint; "
                                "removed the damaged steps %s", step, manager.directory,
                                damaged)
            return restored
        raise DamagedCheckpointError(
            f"no intact checkpoint to resume from in {manager.directory}: steps {damaged} are "
            "all damaged (see the warnings above); move them away to start afresh")

    def _restore_latest_step(self, step: int, params, opt_state, config
                             ) -> tuple[Any, Any, dict]:
        """(params, opt_state, meta) of one latest step, verified (``restore_latest``);
        ``params`` and ``opt_state`` are the abstract trees with their shardings."""
        manager = self.managers[LATEST]
        where = str(epath.Path(manager.directory) / str(step))
        meta, _ = read_meta(manager, step, where, config)
        refuse_per_layer(saved_param_shapes(manager, step), where)
        restored = restore_items(manager, step, params=ocp.args.StandardRestore(params),
                                 opt_state=ocp.args.StandardRestore(opt_state))
        verify_arrays(meta, where, params=restored.params, opt_state=restored.opt_state)
        return restored.params, restored.opt_state, meta

    def save_latest(self, step: int, params, opt_state, meta: dict) -> None:
        """Saves the resumable state of ``step`` with its checksums (a no-op if that step is
        already saved)."""
        manager = self.managers[LATEST]
        if step in manager.all_steps():
            return
        meta = with_checksums(meta, params=params, opt_state=opt_state)
        manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta)))

    def save_if_best(self, step: int, params, meta: dict) -> list[str]:
        """Saves ``params`` as each best checkpoint that ``meta["metrics"]`` improves; returns
        the names of those it replaced."""
        improved, saved_meta = [], None
        for kind in RANKING:
            score = ranking_score(kind, meta["metrics"])
            if self._best[kind] is not None and score <= self._best[kind]:
                continue
            manager = self.managers[kind]
            if step not in manager.all_steps():
                saved_meta = saved_meta or with_checksums(meta, params=params)
                _save_params(manager, step, params, saved_meta)
            self._best[kind] = score
            improved.append(kind)
        return improved

    def save_final(self, step: int, params, meta: dict) -> None:
        """Saves ``params`` as the selected checkpoint whatever its scores (protocols without a
        selection split: the last step is the model)."""
        manager = self.managers[SELECTED]
        if step not in manager.all_steps():
            _save_params(manager, step, params, with_checksums(meta, params=params))

    def close(self) -> None:
        """Waits for pending saves and releases the managers."""
        for manager in self.managers.values():
            manager.wait_until_finished()
            manager.close()


def save_selected(workdir: str, step: int, params, meta: dict) -> None:
    """Saves ``params`` as the selected checkpoint ``step`` of a workdir that has none (an
    imported model, ``trip_jax.convert``), with its checksums; waits until it is written."""
    manager = _manager(workdir, SELECTED)
    try:
        _save_params(manager, step, params, with_checksums(meta, params=params))
        manager.wait_until_finished()
    finally:
        manager.close()


@dataclasses.dataclass
class EvalModel:
    """A trained model rebuilt from its workdir: everything evaluation and prediction need."""

    params: Any                    # placed with ``param_shardings`` on ``mesh``
    tokenizer: Any
    config: Config
    meta: dict[str, Any]           # step, epoch, selection metrics, protocol, encoder config
    step: int
    kind: str                      # its kind (KINDS), whatever name it was asked by
    mesh: jax.sharding.Mesh
    param_shardings: Any

    @functools.cached_property
    def hf_config(self) -> Any:
        """The encoder's transformers config, as saved in ``meta``."""
        return builders.encoder_config_from_dict(self.meta["encoder_config"])

    @functools.cached_property
    def model(self) -> Any:
        """The TieredModel of ``config`` and ``hf_config``, built on first use."""
        return builders.build_model(self.config, self.hf_config)


def _find_step(workdir: str, which: str | int) -> tuple[str, int]:
    """Resolves ``which`` (a name of ``NAMES`` or a step number) to (kind, step): a kind's
    newest step, or the first kind of ``KINDS`` that holds the step."""
    resolved = resolve_name(which)
    kinds = [resolved] if resolved in KINDS else list(KINDS)
    wanted = None if resolved in KINDS else resolved
    found = {}
    for kind in kinds:
        directory = kind_directory(workdir, kind)
        if not directory.is_dir():
            continue
        manager = _manager(workdir, kind, keep=None, create=False)
        steps = manager.all_steps()
        manager.close()
        found[kind] = steps
        if (wanted is None and steps) or wanted in steps:
            return kind, max(steps) if wanted is None else wanted
    listing = "; ".join(f"{k}: {sorted(s) or 'none'}" for k, s in found.items()) or "none"
    raise CheckpointError(no_checkpoint(workdir, which, listing))


def _eval_mesh(fsdp: int) -> jax.sharding.Mesh:
    """All current devices, with the training run's fsdp size where it divides them."""
    count = jax.device_count()
    fsdp = fsdp if fsdp > 0 and count % fsdp == 0 else 1
    return sharding.create_mesh(MeshConfig(data=-1, fsdp=fsdp))


def restore_for_eval(workdir: str, which: str | int = SELECTED, *,
                     mesh: jax.sharding.Mesh | None = None,
                     config: Config | None = None) -> EvalModel:
    """Rebuilds a trained model from ``workdir`` alone, ready to evaluate or predict.

    ``which``: "selected" (default), "best_accuracy", "latest" or a step number. Parameters
    are restored as saved, with the shardings of ``mesh`` (default: every current device, with
    the training run's fsdp size where it divides the device count), and verified against
    their checksums (DamagedCheckpointError on a mismatch or an unreadable file). With
    ``config``, a checkpoint of another model config is a CheckpointError.
    """
    kind, step = _find_step(workdir, which)
    manager = _manager(workdir, kind, keep=None, create=False)
    try:
        where = str(epath.Path(manager.directory) / str(step))
        meta, saved = read_meta(manager, step, where, config)
        shapes = saved_param_shapes(manager, step)
        refuse_per_layer(shapes, where)
        mesh = mesh or _eval_mesh(saved.mesh.fsdp)
        abstract = traverse_util.unflatten_dict(
            {p: jax.ShapeDtypeStruct(m.shape, m.dtype) for p, m in shapes.items()})
        shardings = sharding.tree_shardings(mesh, abstract, saved.mesh.fsdp_min_size)
        params = restore_items(manager, step, params=ocp.args.StandardRestore(
            _abstract(abstract, shardings))).params
        verify_arrays(meta, where, params=params)
    finally:
        manager.close()
    return EvalModel(params=params, tokenizer=load_tokenizer(workdir), config=saved, meta=meta,
                     step=step, kind=kind, mesh=mesh, param_shardings=shardings)
