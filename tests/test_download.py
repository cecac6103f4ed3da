"""download: a local HTTP server on 127.0.0.1 serves the release fixture (no internet here)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import shutil
import socket
import threading

import pytest

from trip_jax.datatools import download
from trip_jax.datatools import __main__ as data_command


def main(argv: list[str]) -> int:
    """``python -m trip_jax.datatools ARGV``, in process: parse, then run."""
    return data_command.main(data_command.parse_flags(["trip_jax.datatools", *argv]))


RELEASE_SAMPLE = "sample.www_2s.json"  # in the shared data directory


@contextlib.contextmanager
def serve(directory):
    """Serves ``directory`` on 127.0.0.1 (ephemeral port) from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, fx, data_dir):
    """A served folder holding the release fixture (the shared one, else a small one)."""
    root = tmp_path / "served"
    root.mkdir()
    sample = os.path.join(data_dir, RELEASE_SAMPLE)
    if os.path.isfile(sample):
        shutil.copy(sample, root / "www_2s_new.json")
    else:
        fx.write_json(root / "www_2s_new.json", fx.release_data())
    (root / "notes.txt").write_text("not the release")
    with serve(root) as url:
        yield url, root / "www_2s_new.json"


def test_download_reports_size_hash_and_pairs(served, tmp_path):
    url, source = served
    expected = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = tmp_path / "data"
    result = download.download_release(str(dest), url=f"{url}/www_2s_new.json",
                                       sha256=expected.upper())
    assert result.path == str(dest / "www_2s_new.json")
    assert (dest / "www_2s_new.json").read_bytes() == source.read_bytes()
    assert result.size == source.stat().st_size and result.sha256 == expected
    assert result.pairs["dev"] > 0 and set(result.pairs) == {"train", "dev", "test"}
    assert os.listdir(dest) == ["www_2s_new.json"]  # no temporary file left behind


def test_cli_download(served, tmp_path, capsys):
    url, source = served
    assert main(["download", f"--dest={tmp_path / 'd'}", f"--url={url}/www_2s_new.json"]) == 0
    out = capsys.readouterr().out
    assert f"size: {source.stat().st_size} bytes" in out
    assert hashlib.sha256(source.read_bytes()).hexdigest() in out and "dev " in out


def test_sha_mismatch_writes_nothing(served, tmp_path):
    url, _ = served
    dest = tmp_path / "data"
    with pytest.raises(download.DownloadError, match="SHA-256 mismatch"):
        download.download_release(str(dest), url=f"{url}/www_2s_new.json", sha256="0" * 64)
    assert os.listdir(dest) == []


def test_not_the_release_writes_nothing(served, tmp_path):
    url, _ = served
    with pytest.raises(download.DownloadError, match="does not hold the TRIP release format"):
        download.download_release(str(tmp_path / "data"), url=f"{url}/notes.txt")
    assert os.listdir(tmp_path / "data") == []


def test_http_error_says_where_to_get_the_file(served, tmp_path):
    url, _ = served
    with pytest.raises(download.DownloadError, match="404") as err:
        download.download_release(str(tmp_path), url=f"{url}/missing.json")
    assert "by hand" in str(err.value) and "sled-group/Verifiable-Coherent-NLU" in str(err.value)


def test_unreachable_server(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/www_2s_new.json"
    assert main(["download", f"--dest={tmp_path}", f"--url={url}", "--timeout=5"]) == 1
    err = capsys.readouterr().err
    assert "could not download" in err and "by hand" in err
    assert f"copy it to {tmp_path / 'www_2s_new.json'}" in err and f"TRIP_DATA_DIR={tmp_path}" in err
    assert not (tmp_path / "www_2s_new.json").exists()
