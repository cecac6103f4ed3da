"""Workdir files through one path layer, ``etils.epath``, so a workdir may be ``gs://...``.

Appends (``append_text``), TensorBoard writers, whole-or-nothing writes (``write_atomic``), JSON
Lines reads, sha256 of files and strict-JSON values, the same on local disks and object stores.
Details: docs/reference.md#training ("Whole files").
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from etils import epath

# tensorboardX writes events itself to local paths and to these prefixes through
# ``register_writer_factory``; ours sends ``gs://`` through epath too (tensorboardX's own needs
# google-cloud-storage and its separate credentials).
_TENSORBOARD_SCHEMES = ("gs",)


def is_local(path: epath.PathLike) -> bool:
    """True for a path of the local file system (no ``scheme://`` prefix)."""
    return "://" not in os.fspath(path)


def write_atomic(path: epath.PathLike, data: str | bytes) -> epath.Path:
    """Writes ``data`` (text as UTF-8) to the file ``path``, whole or not at all (locally a
    temporary ``.NAME.tmp-*`` file renamed over it; docs/reference.md#training)."""
    path = epath.Path(path)
    data = data.encode() if isinstance(data, str) else data
    if not is_local(path):
        path.write_bytes(data)
        return path
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def append_text(path: epath.PathLike, text: str) -> None:
    """Appends ``text`` (whole lines) to the file ``path`` (created if missing): locally in
    one ``write`` call, on an object store by writing the file back whole (``write_atomic``)."""
    path = epath.Path(path)
    if is_local(path):
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            while written < len(data):  # only on a full disk or a signal; finish the line
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        return
    old = path.read_text() if path.exists() else ""
    write_atomic(path, old + text)


class _EpathRecordWriter:
    """A tensorboardX record writer that keeps the event file in memory and writes it whole
    through epath on every flush (object stores have no append; tensorboardX's own GCS writer
    does the same)."""

    def __init__(self, path: str):
        self._path = epath.Path(path)
        self._buffer = io.BytesIO()

    def write(self, data: bytes) -> None:
        """Adds ``data`` to the event file."""
        self._buffer.write(data)

    def flush(self) -> None:
        """Writes the whole event file to its path."""
        self._path.write_bytes(self._buffer.getvalue())

    def close(self) -> None:
        """Writes the event file a last time."""
        self.flush()


class _EpathRecordWriterFactory:
    """tensorboardX's writer-factory interface over epath."""

    def open(self, path: str) -> _EpathRecordWriter:
        """A writer of the event file ``path``."""
        return _EpathRecordWriter(path)

    def directory_check(self, path: str) -> None:
        """Creates the log directory (a no-op on object stores, where directories are implied)."""
        epath.Path(path).mkdir(parents=True, exist_ok=True)


def summary_writer(logdir: epath.PathLike):
    """A ``tensorboardX.SummaryWriter`` for ``logdir``, local or ``gs://``."""
    import tensorboardX
    from tensorboardX import record_writer

    for scheme in _TENSORBOARD_SCHEMES:
        if not isinstance(record_writer.REGISTERED_FACTORIES.get(scheme),
                          _EpathRecordWriterFactory):
            record_writer.register_writer_factory(scheme, _EpathRecordWriterFactory())
    return tensorboardX.SummaryWriter(os.fspath(logdir))


def copy_tree(source: epath.PathLike, target: epath.PathLike) -> None:
    """Copies the files of directory ``source`` (recursively) into ``target``, each side local
    or remote: how libraries that only write local directories (Hugging Face
    ``save_pretrained``) reach a remote workdir and back."""
    source, target = epath.Path(source), epath.Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_dir():
            copy_tree(path, target / path.name)
        else:
            write_atomic(target / path.name, path.read_bytes())


def read_jsonl(path: epath.PathLike) -> list[dict[str, Any]]:
    """The records of a JSON Lines file (blank lines skipped); ValueError naming the file and
    line when one is not JSON."""
    records = []
    for line_no, line in enumerate(epath.Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not a JSON record ({err.msg})") from None
    return records


def file_sha256(path: epath.PathLike) -> str:
    """Returns the hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with epath.Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def data_file_hashes(paths: Iterable[epath.PathLike]) -> dict[str, str]:
    """Returns {file name in its data directory: sha256} for the data files an evaluation read
    (never the machine's path: reports are read on other machines)."""
    return {epath.Path(path).name: file_sha256(path) for path in paths}


def to_jsonable(value: Any) -> Any:
    """Converts numpy values, tuples and NaN/inf (to None) into strict-JSON Python values."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value
