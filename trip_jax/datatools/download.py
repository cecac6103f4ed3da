"""Fetches the authors' TRIP release (``www_2s_new.json``) with the standard library only.

The file is streamed to a temporary file next to its destination, hashed, optionally checked
against an expected SHA-256, parsed with the release reader, and only then moved into place, so
a failed or partial download never leaves a file that looks complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import urllib.error
import urllib.request

from trip_jax.data import readers

DEFAULT_URL = readers.RELEASE_URL
_CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """The release could not be fetched, or what was fetched is not the expected file."""


@dataclasses.dataclass(frozen=True)
class DownloadResult:
    """What was written: the path, its size in bytes, its SHA-256 and pairs per partition."""

    path: str
    size: int
    sha256: str
    pairs: dict[str, int]


def _by_hand(url: str, dest: str) -> str:
    target = os.path.join(dest, readers.RELEASE_FILENAME)
    return (f"Get the file by hand: on a machine with internet access download {url} (the "
            "authors' file is all_data/www_2s_new.json of "
            f"https://github.com/sled-group/Verifiable-Coherent-NLU), copy it to {target} and "
            f"set ${readers.DATA_DIR_ENV}={dest} (or pass --data_dir={dest}).")


def download_release(dest: str, url: str = DEFAULT_URL, sha256: str | None = None,
                     timeout: float = 60.0) -> DownloadResult:
    """Downloads the release into ``dest/www_2s_new.json`` and checks it.

    Args:
      dest: directory to write into (created if missing).
      url: where to fetch from.
      sha256: expected hex digest; when given, a mismatch fails and writes nothing.
      timeout: socket timeout in seconds.

    Raises:
      DownloadError: unreachable URL or HTTP error (the message says where to get the file by
        hand), SHA-256 mismatch, or a file that does not parse as the release format.
    """
    os.makedirs(dest, exist_ok=True)
    target = os.path.join(dest, readers.RELEASE_FILENAME)
    fd, tmp = tempfile.mkstemp(prefix=".www_2s_new.", suffix=".part", dir=dest)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    while chunk := response.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
            except (urllib.error.URLError, OSError, ValueError) as err:
                raise DownloadError(
                    f"could not download {url}: {err}. {_by_hand(url, dest)}") from err
        got = digest.hexdigest()
        if sha256 and got.lower() != sha256.strip().lower():
            raise DownloadError(f"SHA-256 mismatch for {url}: expected {sha256}, got {got} "
                                f"({size} bytes); nothing written. {_by_hand(url, dest)}")
        pairs = _check_parses(tmp, url)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return DownloadResult(path=target, size=size, sha256=got, pairs=pairs)


def _check_parses(path: str, url: str) -> dict[str, int]:
    with open(path, "rb") as f:
        if f.read(40).startswith(b"version https://git-lfs"):
            raise DownloadError(f"{url} served a Git LFS pointer, not the data; download the file "
                                "through GitHub's web page or `git lfs pull` instead")
    try:
        partitions = readers.read_release_partitions(path)
    except (readers.TripDataError, UnicodeDecodeError) as err:
        raise DownloadError(f"{url} does not hold the TRIP release format: {err}") from err
    return {name: len(pairs) for name, pairs in partitions.items()}
