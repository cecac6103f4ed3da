"""Workdir files on a non-local file system: every one goes through etils.epath.

``fake_gcs`` serves ``gs://`` paths from an in-memory fsspec file system, the way etils.epath
serves them from gcsfs on a real bucket when TensorFlow is absent, and runs the test in an
empty working directory so that a ``gs://`` path handled as a local one by mistake (pathlib
makes ``gs:/bucket/...`` of it) shows up on local disk.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys

import fsspec
import numpy as np
import pytest
from etils import epath
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from trip_jax.config.typed import as_dict, typed
from trip_jax.data import schema
from trip_jax.evaluation import metrics, predict, reports
from trip_jax.models import builders
from trip_jax.runtime import paths, workdir_lock
from trip_jax.training import checkpoints
from trip_jax.training.metric_log import MetricLog
from trip_jax.data.tokenizers import build_word_level_tokenizer, load_tokenizer, tokenizer_info

BUCKET = "gs://bucket"


@pytest.fixture
def fake_gcs(monkeypatch, tmp_path):
    """Routes ``gs://`` paths of etils.epath to a fresh in-memory file system; yields
    ``(epath.Path("gs://bucket"), the fsspec file system)``. Append mode is refused, as GCS
    objects cannot be appended to (gcsfs silently overwrites instead)."""

    class FakeGCS(MemoryFileSystem):
        protocol = ("gs", "gcs")
        store: dict = {}  # noqa: RUF012 - each fixture's own class, own store
        pseudo_dirs: list = [""]  # noqa: RUF012
        cachable = False

        def __init__(self, *args, finalize_on_close: bool = True, **kwargs):
            del finalize_on_close  # gcsfs's option, passed by etils.epath
            super().__init__(*args, **kwargs)

        @classmethod
        def _strip_protocol(cls, path):
            path = fsspec.utils.stringify_path(path)
            for prefix in ("gs://", "gcs://"):
                if path.startswith(prefix):
                    path = path[len(prefix):]
            return super()._strip_protocol(path)

        def _open(self, path, mode="rb", **kwargs):
            if "a" in mode:
                raise NotImplementedError(f"cannot append to GCS object {path}")
            return super()._open(path, mode, **kwargs)

    registry = importlib.import_module("fsspec.registry")._registry
    for protocol in FakeGCS.protocol:
        monkeypatch.setitem(registry, protocol, FakeGCS)
    monkeypatch.setenv("EPATH_USE_TF", "false")  # the fsspec backend even if TF is installed
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    monkeypatch.chdir(tmp_path)
    yield epath.Path(BUCKET), FakeGCS()
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    assert list(tmp_path.iterdir()) == [], "a gs:// path was written to local disk"


def stored(fs) -> set[str]:
    """Every file of the fake file system, as gs:// paths."""
    return {f"gs:/{name}" for name in fs.store}


def test_fake_gcs_is_what_epath_uses_for_gs_paths(fake_gcs):
    root, fs = fake_gcs
    (root / "a" / "b.txt").write_text("x")
    assert stored(fs) == {"gs://bucket/a/b.txt"}
    assert (root / "a").is_dir() and [p.name for p in (root / "a").iterdir()] == ["b.txt"]
    with pytest.raises(NotImplementedError):
        (root / "a" / "b.txt").open("a")


def test_run_files_and_tokenizer_round_trip(fake_gcs):
    root, fs = fake_gcs
    workdir = str(root / "run")
    config = typed(importlib.import_module("configs.tiny").get_config())
    tokenizer = build_word_level_tokenizer(["Mary went to the kitchen.", "She ate an apple."])
    hf_config = builders.random_encoder_config(config.model, tokenizer)
    checkpoints.write_run_files(workdir, config, hf_config, tokenizer)

    files = stored(fs)
    assert {f"{workdir}/config.json", f"{workdir}/encoder_config.json",
            f"{workdir}/tokenizer/tokenizer.json"} <= files
    assert json.loads((root / "run" / "config.json").read_text()) == as_dict(config)
    encoder = json.loads((root / "run" / "encoder_config.json").read_text())
    assert encoder["vocab_size"] == tokenizer_info(tokenizer).vocab_size

    for loaded in (checkpoints.load_tokenizer(workdir),
                   load_tokenizer(f"{workdir}/tokenizer")):  # a gs:// tokenizer spec too
        assert tokenizer_info(loaded) == tokenizer_info(tokenizer)
        pair = ("Mary ate the apple.", "She went to a garden.")
        assert loaded(*pair)["input_ids"] == tokenizer(*pair)["input_ids"]
    with pytest.raises(checkpoints.CheckpointError, match="no saved tokenizer"):
        checkpoints.load_tokenizer(str(root / "elsewhere"))


def scored_pairs():
    """Metrics and records of two hand-built pairs (one verifiable, one wrong story)."""
    E, S, A = 2, 4, schema.NUM_ATTRIBUTES
    conflict = np.zeros((2, 2, E, S), dtype=np.int32)
    conflict[:, 1, 0, [1, 3]] = 1
    pre = np.zeros((2, 2, E, S, A), dtype=np.int32)
    args = metrics.TieredArrays(np.array([0, 0]), np.array([0, 1]), conflict, conflict * 0.8,
                                pre, pre, pre, pre)
    scores, outcomes = metrics.scored_pairs(args)
    records = [{"pair_id": f"p{n}", **metrics.outcome_record(outcomes, n)} for n in range(2)]
    return scores, records


def test_report_files(fake_gcs):
    root, fs = fake_gcs
    data = root / "data" / "test.jsonl"
    data.write_text("{}\n")
    scores, records = scored_pairs()
    written = reports.write_report(root / "run" / "eval", "test", scores,
                                   {"data_files": paths.data_file_hashes([data])}, records)
    assert {str(p) for p in written.values()} | {str(data)} == stored(fs)
    assert json.loads(written["json"].read_text())["metrics"]["accuracy"] == 0.5
    assert "| model | 50.0 |" in written["markdown"].read_text()
    for key in ("failure_modes_plot", "attributes_plot"):
        assert written[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = written["predictions"].read_text().splitlines()
    assert [json.loads(line)["pair_id"] for line in lines] == ["p0", "p1"]

    answers = reports.write_predictions(root / "run" / "predict" / "new.jsonl", records[:1])
    assert str(answers) in stored(fs) and len(answers.read_text().splitlines()) == 1


def test_metrics_log_appends_and_tensorboard_events(fake_gcs):
    root, fs = fake_gcs
    log = root / "run" / "metrics.jsonl"
    for step in (1, 2, 3):
        paths.append_text(log, json.dumps({"step": step}) + "\n")
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3]

    writer = paths.summary_writer(root / "run" / "tensorboard")
    writer.add_scalar("train/loss", 0.5, 1)
    writer.add_scalar("train/accuracy", 0.25, 2)
    writer.close()  # events reach the file from a background thread; close waits for them
    events = list((root / "run" / "tensorboard").iterdir())
    assert len(events) == 1 and events[0].name.startswith("events.out.tfevents.")
    data = events[0].read_bytes()
    assert b"train/loss" in data and b"train/accuracy" in data
    assert stored(fs) == {str(log), str(events[0])}


def test_run_metric_log_on_gs(fake_gcs):
    root, fs = fake_gcs
    log = MetricLog(root / "run")
    for step in (1, 2, 3):
        log.write(step, "train", {"loss/total": 1.0 / step})
    log.drop_after(2)  # what a resumed run does with records logged after its checkpoint
    log.close()
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [(1, "train"), (2, "train")]
    assert any(name.startswith("gs://bucket/run/tensorboard/events.out.tfevents.")
               for name in stored(fs))


def test_predictions_read_and_written_on_gs(fake_gcs):
    root, fs = fake_gcs
    given = root / "in" / "pairs.jsonl"
    given.write_text('{"id": "a", "stories": []}\n{"id": "b"}\n')
    requests, problems = predict.read_requests(str(given), max_sentences=7)
    assert requests == [] and sorted(problems) == [1, 2]
    output = root / "run" / "predict" / "pairs.jsonl"
    predict._write(output, [], problems, str(given))
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["line"], r["id"]) for r in written] == [(1, "a"), (2, "b")]
    assert str(output) in stored(fs)


def test_local_workdirs_keep_working(tmp_path):
    log = tmp_path / "metrics.jsonl"
    paths.append_text(log, "a\n")
    paths.append_text(str(log), "b\n")
    assert log.read_text() == "a\nb\n"
    writer = paths.summary_writer(tmp_path / "tensorboard")
    writer.add_scalar("train/loss", 0.5, 1)
    writer.close()
    (event,) = (tmp_path / "tensorboard").iterdir()
    assert b"train/loss" in event.read_bytes()
    target = tmp_path / "copy"
    paths.copy_tree(tmp_path / "tensorboard", target)
    assert (target / event.name).read_bytes() == event.read_bytes()


def test_workdir_lock_on_gs(fake_gcs, monkeypatch, caplog):
    root, fs = fake_gcs
    lock = workdir_lock.acquire(root / "run")
    path = f"{BUCKET}/run/{workdir_lock.LOCK_FILE}"
    assert stored(fs) == {path}
    with pytest.raises(workdir_lock.WorkdirLocked, match=f"process {os.getpid()} on "):
        workdir_lock.acquire(root / "run")
    lock.release()
    assert stored(fs) == set()

    # A holder on this host whose process is gone (a finished child's id) is taken over.
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    stale = {"host": socket.gethostname(), "pid": int(child.stdout), "started": "then",
             "command": "python -m trip_jax.main", "token": "old"}
    (root / "run" / workdir_lock.LOCK_FILE).write_text(json.dumps(stale))
    with caplog.at_level("WARNING"), workdir_lock.acquire(root / "run") as taken:
        assert taken.holder["pid"] == os.getpid()
    assert any("taking over" in r.getMessage() and str(stale["pid"]) in r.getMessage()
               for r in caplog.records)
    # One on another host cannot be checked from here: refused, named.
    (root / "run" / workdir_lock.LOCK_FILE).write_text(json.dumps({**stale, "host": "elsewhere"}))
    with pytest.raises(workdir_lock.WorkdirLocked, match="on elsewhere"):
        workdir_lock.acquire(root / "run")


def test_atomic_writes_leave_the_previous_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    paths.write_atomic(target, "old\n")

    def crash(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(paths.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        paths.write_atomic(target, "new\n")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == [
        "config.json"]
    monkeypatch.undo()
    reports.write_predictions(tmp_path / "p.jsonl", [{"a": 1}, {"a": 2}])
    assert (tmp_path / "p.jsonl").read_text() == '{"a":1}\n{"a":2}\n'


def test_atomic_writes_on_gs_leave_no_temporary_objects(fake_gcs):
    root, fs = fake_gcs
    paths.write_atomic(root / "run" / "config.json", "{}\n")
    paths.write_atomic(root / "run" / "config.json", '{"a": 1}\n')
    assert stored(fs) == {f"{BUCKET}/run/config.json"}
    assert (root / "run" / "config.json").read_text() == '{"a": 1}\n'


def test_metric_log_cuts_a_partial_last_line(tmp_path, caplog):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "split": "train"}\n{"step": 2, "split": "tr')
    metric_log = MetricLog(tmp_path)
    with caplog.at_level("WARNING"):
        metric_log.drop_after(5)
    metric_log.write(2, "train", {"loss/total": 0.5})
    metric_log.close()
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]
    (warning,) = [r.getMessage() for r in caplog.records if "partial line" in r.getMessage()]
    assert "\n" not in warning
