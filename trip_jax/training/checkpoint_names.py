"""The names of a workdir's checkpoints and config file, and the line for a workdir without
checkpoints: plain strings and ``os.path``, so that the command line checks ``--checkpoint``
and an untrained workdir without importing JAX or orbax (``trip_jax/training/checkpoints.py``
uses the same names and line)."""

import os

LATEST = "latest"
SELECTED = "selected"
BEST_ACCURACY = "best_accuracy"
KINDS: tuple[str, ...] = (LATEST, SELECTED, BEST_ACCURACY)
CONFIG_FILE = "config.json"
CHECKPOINTS_DIR = "checkpoints"


def no_checkpoint(workdir: str, which: str | int, listing: str = "none") -> str:
    """The one line for a ``workdir`` without checkpoint ``which`` (``listing``: the steps it
    holds of each kind looked in)."""
    return (f"no checkpoint {which!r} in {os.path.join(workdir, CHECKPOINTS_DIR)} "
            f"(found {listing}); train first with "
            f"`python -m trip_jax.main --config=... --workdir={workdir}`")


def untrained(workdirs: list[str], which: str | int) -> str | None:
    """``no_checkpoint`` for the first local workdir of ``workdirs`` that has no checkpoints
    folder at all, else None (a folder that exists, or a remote one, is for the restore to
    judge)."""
    for workdir in workdirs:
        if "://" not in workdir and not os.path.isdir(os.path.join(workdir, CHECKPOINTS_DIR)):
            return no_checkpoint(workdir, which)
    return None
