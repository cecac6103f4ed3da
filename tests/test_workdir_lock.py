"""The workdir lock (trip_jax/runtime/workdir_lock.py) on a local file system; gs:// in test_workdirs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from trip_jax.runtime import workdir_lock

KILL_HOLDING_THE_LOCK = (
    "import os, signal, sys\n"
    "from trip_jax.runtime import workdir_lock\n"
    "workdir_lock.acquire(sys.argv[1])\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n")


def test_second_holder_is_refused_until_release(tmp_path):
    lock = workdir_lock.acquire(tmp_path)
    holder = json.loads((tmp_path / workdir_lock.LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert holder["command"] and holder["started"]
    with pytest.raises(workdir_lock.WorkdirLocked) as refused:
        workdir_lock.acquire(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and f"process {os.getpid()} on {socket.gethostname()}" in message
    assert refused.value.exit_code == 2
    assert json.loads((tmp_path / workdir_lock.LOCK_FILE).read_text()) == holder  # untouched
    lock.release()
    assert (tmp_path / workdir_lock.LOCK_FILE).read_text() == ""
    with workdir_lock.acquire(tmp_path) as again:
        assert again.holder["token"] != holder["token"]


def test_lock_of_a_killed_process_is_taken_over(tmp_path, repo, caplog):
    result = subprocess.run([sys.executable, "-c", KILL_HOLDING_THE_LOCK, str(tmp_path)],
                            cwd=repo, capture_output=True, text=True, timeout=60)
    assert result.returncode == -9, result.stderr
    dead = json.loads((tmp_path / workdir_lock.LOCK_FILE).read_text())
    assert dead["pid"] != os.getpid()
    with caplog.at_level("WARNING"), workdir_lock.acquire(tmp_path) as lock:
        assert lock.holder["pid"] == os.getpid()
    (warning,) = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert f"process {dead['pid']} on {dead['host']}" in warning and "\n" not in warning


def test_a_run_that_stops_before_it_starts_leaves_no_workdir(tmp_path, tiny_config):
    """train_and_evaluate removes the workdir it created when it stops before writing anything
    (here: the data cannot be read); a workdir that was there stays."""
    from trip_jax import train
    from trip_jax.data.readers import TripDataError

    config = tiny_config()
    config.data.data_dir = str(tmp_path / "no_data")
    fresh, existing = tmp_path / "fresh" / "fold0", tmp_path / "existing"
    existing.mkdir()
    for workdir in (fresh, existing):
        with pytest.raises(TripDataError, match="no_data"):
            train.train_and_evaluate(config, str(workdir))
    assert not fresh.parent.exists()  # both folders the call made
    # A workdir that was there keeps the released (empty) lock file, as after any run.
    assert [p.name for p in existing.iterdir()] == [workdir_lock.LOCK_FILE]
    assert (existing / workdir_lock.LOCK_FILE).read_text() == ""
