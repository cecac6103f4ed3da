"""Reading one saved checkpoint step: its items, or one line naming what is unreadable or damaged.

``restore_items`` and ``saved_param_shapes`` turn any orbax or TensorStore failure into a
``DamagedCheckpointError`` naming the array or file; ``with_checksums`` records a step's
checksums, ``verify_meta`` / ``verify_arrays`` check them. Details: docs/reference.md#training.
"""

from __future__ import annotations

import re
from typing import Any

import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import traverse_util

from trip_jax.runtime import terminal
from trip_jax.training import checksums

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
    recorded = {name: checksums.tree_checksums(tree) for name, tree in trees.items()}
    return {**meta, CHECKSUMS: {"meta": checksums.meta_checksum(meta), **recorded}}


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
    saved, found = _recorded(meta).get("meta"), checksums.meta_checksum(rest)
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
        mismatch = checksums.first_mismatch(saved if isinstance(saved, dict) else {},
                                            checksums.tree_checksums(tree))
        if mismatch is not None:
            path, saved, found = mismatch
            terminal.note_aborted_read(where)  # reads of it still under way are leftovers too
            raise DamagedCheckpointError(
                f"checkpoint {where} is damaged: {one_line(name + path)} has checksum "
                f"{one_line(found)}, saved with {one_line(saved)}")
