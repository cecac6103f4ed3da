"""One training run per workdir: ``WORKDIR/LOCK`` names the run that holds it.

``acquire(workdir)`` returns a ``WorkdirLock`` or raises ``WorkdirLocked`` naming the holder,
before anything is written: ``flock`` locally, a written-then-read-back object on ``gs://``.
Details: docs/reference.md#training ("One training run per workdir").
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import uuid
from typing import Any

from absl import logging
from etils import epath

from trip_jax.runtime import paths

LOCK_FILE = "LOCK"


class WorkdirLocked(RuntimeError):
    """Another run holds the workdir. ``exit_code`` 2: a usage error, nothing was touched."""

    exit_code = 2


def _holder() -> dict[str, Any]:
    """This process as a lock holder."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "token": uuid.uuid4().hex}


def describe(holder: dict[str, Any]) -> str:
    """A holder in words: host, process id, start time and command."""
    return (f"process {holder.get('pid')} on {holder.get('host')}, started "
            f"{holder.get('started')}: {holder.get('command')}")


def _parse(text: str) -> dict[str, Any] | None:
    """The holder a lock file describes; None for an empty (released) or unreadable one."""
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return None
    return holder if isinstance(holder, dict) else None


def _process_gone(holder: dict[str, Any]) -> bool:
    """True when ``holder`` ran on this host and its process no longer exists."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, owned by another user
        return False
    return False


class WorkdirLock:
    """A held lock on one workdir (``acquire``)."""

    def __init__(self, path: epath.Path, holder: dict[str, Any], fd: int | None):
        self.path = path
        self.holder = holder
        self._fd = fd

    def release(self) -> None:
        """Gives the workdir up (idempotent)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        elif self.holder is not None:
            if self.path.exists() and (_parse(self.path.read_text()) or {}).get(
                    "token") == self.holder["token"]:
                self.path.unlink()
        self.holder = None

    def __enter__(self) -> WorkdirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(workdir: epath.PathLike) -> WorkdirLock:
    """Takes the lock of ``workdir`` (which must exist) for this process (module docstring).

    WorkdirLocked when a live run holds it; a lock left by a run that is gone is taken over
    with a one-line warning.
    """
    path = epath.Path(workdir) / LOCK_FILE
    if paths.is_local(path):
        return _acquire_local(path)
    return _acquire_remote(path)


def _refuse(path: epath.Path, holder: dict[str, Any] | None) -> WorkdirLocked:
    who = describe(holder) if holder else "another process (the lock file is being written)"
    return WorkdirLocked(f"the workdir {path.parent} is in use by {who} (lock file {path}); "
                         "wait for that run to end, or use another --workdir")


def _acquire_local(path: epath.Path) -> WorkdirLock:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise _refuse(path, _parse(path.read_text())) from None
    previous = _parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
    if previous is not None:
        logging.warning("taking over the lock of %s: %s, which ended without releasing it "
                        "(killed?)", path.parent, describe(previous))
    holder = _holder()
    data = json.dumps(holder).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    return WorkdirLock(path, holder, fd)


def _acquire_remote(path: epath.Path) -> WorkdirLock:
    if path.exists():
        previous = _parse(path.read_text())
        if previous is None or not _process_gone(previous):
            raise _refuse(path, previous)
        logging.warning("taking over the lock of %s: %s, whose process is gone", path.parent,
                        describe(previous))
    holder = _holder()
    paths.write_atomic(path, json.dumps(holder))
    found = _parse(path.read_text())
    if found is None or found.get("token") != holder["token"]:
        raise _refuse(path, found)
    return WorkdirLock(path, holder, None)


def acquire_for_run(workdir: epath.PathLike) -> WorkdirLock | None:
    """``acquire`` for a run of one or more JAX processes: process 0 takes the lock and tells
    the others whether it got it (every process raises WorkdirLocked if not). Returns the lock
    on process 0, None on the others."""
    import jax
    import numpy as np

    if jax.process_count() == 1:
        return acquire(workdir)
    from jax.experimental import multihost_utils

    lock, refused = None, None
    if jax.process_index() == 0:
        try:
            lock = acquire(workdir)
        except WorkdirLocked as err:
            refused = err
    if not multihost_utils.broadcast_one_to_all(np.int32(refused is None)):
        raise refused or WorkdirLocked(f"the workdir {workdir} is in use by another run "
                                       "(process 0 names it)")
    return lock
