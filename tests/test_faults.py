"""Faults a run must survive or report: damaged checkpoint files, kills at random points.

Damage: every kind of file of a saved checkpoint is damaged in turn; restoring either raises
a CheckpointError or gives the saved parameters bit for bit, never other weights. Kills: a
tiny training run (the config of conftest's ``trained_workdir``) is killed with SIGKILL at three
random points, one of them inside a checkpoint save, and started again each time
(``tests/fault_worker.py``); the last run must end with the parameters and the test report of
the uninterrupted ``trained_workdir``. The points are drawn from a fixed seed (0, so CI repeats
them); ``TRIP_FAULT_SEED=N`` draws others, and a failure names the seed.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from trip_jax import train
from trip_jax.runtime import workdir_lock
from trip_jax.training import checkpoint_reads, checkpoints

pytestmark = pytest.mark.usefixtures("compilation_cache")

# The kill points of a one-epoch tiny run (4 steps, latest checkpoints at 2 and 4, selection
# and best checkpoints at 4), in the order the run reaches them.
POINTS = ("step:1", "save:latest:2", "step:3", "save:selected:4",
          "save:best_accuracy:4", "save:latest:4", "report")


def params_of(workdir, which):
    return jax.device_get(checkpoints.restore_for_eval(str(workdir), which).params)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def flip(path, offset=None):
    """Inverts 8 bytes of the file ``path`` in its middle (or at ``offset``)."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 if offset is None else offset
    for i in range(start, min(start + 8, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def misrecord(step, item):
    """Makes the checksum ``step``'s metadata records for the first array of ``item`` (params,
    opt_state) differ from the array, as if the array had changed after it was saved: the
    files read without error and the metadata's own checksum (which leaves the array checksums
    out) still holds. (A flipped byte of an array file lands in zstd-compressed data, which
    reads as other values or not at all, depending on where orbax wrote each array.)"""
    path = step / "meta" / "metadata"
    meta = json.loads(path.read_text())
    recorded = meta["checksums"][item]
    first = min(recorded)
    described, digits = recorded[first].rsplit(":", 1)
    recorded[first] = f"{described}:{int(digits, 16) ^ 0xFFFFFFFFFFFFFFFF:016x}"
    path.write_text(json.dumps(meta))


def step_dir(workdir, kind):
    return max((workdir / "checkpoints" / kind).glob("[0-9]*"), key=lambda p: int(p.name))


def file_kind(path, root):
    """A file's place in a step directory with content hashes left out (``params/d/*``)."""
    return re.sub(r"[0-9a-f]{32}", "*", str(path.relative_to(root)))


def test_every_kind_of_damaged_file_is_refused_or_harmless(trained_workdir, tmp_path):
    good = params_of(trained_workdir, "selected")
    step = step_dir(trained_workdir, "selected")
    kinds = {}
    for path in sorted(p for p in step.rglob("*") if p.is_file()):
        kinds.setdefault(file_kind(path, step), path)  # the first file of each kind
    largest = max((p for p in (step / "params").rglob("*") if p.is_file()
                   and "d" in p.relative_to(step).parts), key=lambda p: p.stat().st_size)
    outcomes = {}
    for kind, original in [*kinds.items(), ("largest array file", largest)]:
        workdir = tmp_path / f"case{len(outcomes)}"
        shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("reports"))
        flip(workdir / original.relative_to(trained_workdir))
        try:
            params = params_of(workdir, "selected")
        except checkpoints.CheckpointError as err:
            message = str(err)
            assert "\n" not in message and str(workdir) in message, message
            outcomes[kind] = message
            continue
        assert_trees_equal(params, good)  # a file the weights do not depend on
        outcomes[kind] = "harmless"
    # The largest array file is refused, as read (a checksum differs) or as unreadable: which
    # depends on the compressed bytes the flip lands in (``misrecord``).
    assert outcomes["largest array file"].startswith(f"checkpoint {workdir / 'checkpoints'}")
    # An array that reads as other values than it was saved with: refused by its checksum.
    workdir = tmp_path / "misrecorded"
    shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("reports"))
    misrecord(step_dir(workdir, "selected"), "params")
    with pytest.raises(checkpoints.DamagedCheckpointError) as err:
        params_of(workdir, "selected")
    assert re.search(r"params\[.*\] has checksum float32\[[0-9,]+\]:[0-9a-f]{16}, saved with "
                     r"float32\[[0-9,]+\]:[0-9a-f]{16}$", str(err.value))
    # Every kind of file was tried, among them each that the weights depend on.
    for kind in ("params/manifest.ocdbt", "params/_METADATA", "meta/metadata"):
        assert outcomes[kind] != "harmless", kind
    print({k: v[:100] for k, v in outcomes.items()})


def test_damaged_metadata_that_still_parses_is_refused(trained_workdir, tmp_path):
    workdir = tmp_path / "meta"
    shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("reports"))
    step = step_dir(workdir, "selected")
    meta = json.loads((step / "meta" / "metadata").read_text())
    meta["metrics"]["accuracy"] += 0.5
    (step / "meta" / "metadata").write_text(json.dumps(meta))
    with pytest.raises(checkpoints.DamagedCheckpointError,
                       match=rf"^checkpoint {step} is damaged: its metadata has checksum "
                             r"[0-9a-f]{64}, saved with [0-9a-f]{64}$"):
        checkpoints.restore_for_eval(str(workdir))


def test_evaluate_on_a_damaged_checkpoint_is_one_line(trained_workdir, tmp_path, run_main):
    workdir = tmp_path / "damaged"
    shutil.copytree(trained_workdir, workdir)
    step = step_dir(workdir, "selected")
    misrecord(step, "params")
    shutil.rmtree(workdir / "eval", ignore_errors=True)
    result = run_main(f"--workdir={workdir}", "--mode=evaluate")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: checkpoint {step} is damaged: params\[.*\] has checksum "
                        r"\S+, saved with \S+", errors[0]), errors[0]
    assert not (workdir / "eval").exists()  # no report from the damaged weights


class FailingManager:
    """A checkpoint manager of ``directory`` whose every restore raises ``error``."""

    def __init__(self, directory, error):
        self.directory, self.error = directory, error

    def restore(self, step, args):
        raise self.error


def test_a_damaged_checkpoint_is_one_line_whatever_the_cause(tmp_path):
    # An underlying error of several lines (as TensorStore's can be), naming an array and a
    # file whose names, read off damaged files, hold line breaks.
    cause = ValueError(f'Error reading "params.encoder\n  kernel/.zarray": DATA_LOSS\n'
                       f'local file "{tmp_path}/4/params/d/\nab"\n\n  at byte 400\n')
    with pytest.raises(checkpoint_reads.DamagedCheckpointError) as err:
        checkpoint_reads.restore_items(FailingManager(tmp_path, cause), 4, params=None)
    assert str(err.value) == (
        f"checkpoint {tmp_path}/4 is damaged or unreadable: could not restore its array "
        "params.encoder kernel, file params/d/ ab (the cause is logged at debug level, "
        "--verbosity=1)")
    # Checksums read off a damaged metadata file: a path with line breaks, a long value.
    meta = {"checksums": {"params": {"['a\n\n  b']": "float32[2]:\n" + "f" * 1000}}}
    with pytest.raises(checkpoint_reads.DamagedCheckpointError) as err:
        checkpoint_reads.verify_arrays(meta, f"{tmp_path}/4", params={"a": np.zeros(2)})
    message = str(err.value)
    assert "\n" not in message and len(message) < len(str(tmp_path)) + 2 * 160 + 80, message
    assert message.startswith(f"checkpoint {tmp_path}/4 is damaged: params['a b'] has "
                              "checksum None, saved with float32[2]: fff")
    assert message.endswith("...")


def test_checkpoints_without_checksums_restore_with_a_warning(trained_workdir, tmp_path,
                                                              caplog):
    workdir = tmp_path / "old"
    shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("reports"))
    meta_file = step_dir(workdir, "selected") / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    del meta["checksums"]
    meta_file.write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        params = params_of(workdir, "selected")
    assert_trees_equal(params, params_of(trained_workdir, "selected"))
    warnings = [r.getMessage() for r in caplog.records if "carries no checksums" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]


def test_resume_skips_a_damaged_latest_checkpoint(trained_workdir, tiny_config, tmp_path,
                                                  caplog):
    workdir = tmp_path / "resume"
    shutil.copytree(trained_workdir, workdir)
    for name in ("reports", "TRAINED"):
        shutil.rmtree(workdir / name, ignore_errors=True)
    assert [p.name for p in sorted((workdir / "checkpoints" / "latest").glob("[0-9]*"))] == [
        "2", "4"]
    newest = workdir / "checkpoints" / "latest" / "4"
    misrecord(newest, "opt_state")
    config = tiny_config()
    config.train.num_epochs = 1
    with caplog.at_level("WARNING"):
        train.train_and_evaluate(config, str(workdir))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"checkpoint {newest} is damaged: opt_state") for m in messages)
    assert any("resuming from step 2" in m for m in messages)
    # Steps 3 and 4 trained again from the intact step 2: the uninterrupted run's parameters.
    for which in ("latest", "selected"):
        assert_trees_equal(params_of(workdir, which), params_of(trained_workdir, which))

    for step in ("2", "4"):  # now both damaged: nothing to resume from, nothing removed
        flip(max((workdir / "checkpoints" / "latest" / step / "params").rglob("*"),
                 key=lambda p: p.stat().st_size if p.is_file() else -1))
    with pytest.raises(checkpoints.DamagedCheckpointError, match="no intact checkpoint"):
        train.train_and_evaluate(config, str(workdir))
    assert sorted(p.name for p in (workdir / "checkpoints" / "latest").glob("[0-9]*")) == [
        "2", "4"]


def test_a_second_training_on_a_workdir_is_refused(tmp_path, run_main):
    workdir = tmp_path / "held"
    workdir.mkdir()
    with workdir_lock.acquire(workdir):
        before = {p: p.read_bytes() for p in workdir.rglob("*")}
        result = run_main(f"--workdir={workdir}", timeout=120)
        assert {p: p.read_bytes() for p in workdir.rglob("*")} == before  # nothing touched
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the workdir {workdir} is in use by process {os.getpid()} "
                           "on "), last
    assert "Traceback" not in result.stderr


def kill_points(seed: int) -> list[str]:
    """Three kill points in run order, one of them inside a checkpoint save."""
    rng = random.Random(seed)
    saves = [p for p in POINTS if p.startswith("save:")]
    first = rng.choice(saves)
    chosen = {first, *rng.sample([p for p in POINTS if p != first], 2)}
    return sorted(chosen, key=POINTS.index)


def test_killed_at_random_points_and_restarted_ends_like_an_uninterrupted_run(
        trained_workdir, tmp_path, data_dir, repo, main_job_env):
    # Seed 0 unless TRIP_FAULT_SEED=N asks for another draw (the messages name it).
    seed = int(os.environ.get("TRIP_FAULT_SEED") or 0)
    points = kill_points(seed)
    workdir = tmp_path / "killed"
    env = main_job_env()
    for number, point in enumerate([*points, "none"]):
        result = subprocess.run(
            [sys.executable, str(repo / "tests" / "fault_worker.py"), str(workdir), data_dir,
             point], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        where = f"seed {seed}, points {points}, run {number} ({point})"
        # Killed exactly at its point: the restart before it did not crash.
        assert result.returncode == (0 if point == "none" else -9), (where, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (where, result.stderr[-3000:])
        if number:  # the killed run before left its lock behind
            assert "taking over the lock" in result.stderr, (where, result.stderr[-3000:])
    for which in ("latest", "selected", "best_accuracy"):
        assert_trees_equal(params_of(workdir, which), params_of(trained_workdir, which))
    report = json.loads((workdir / "reports" / "test.json").read_text())
    expected = json.loads((trained_workdir / "reports" / "test.json").read_text())
    assert report["metrics"] == expected["metrics"]
    assert (workdir / "reports" / "test.md").read_text() == (
        trained_workdir / "reports" / "test.md").read_text()
    left = [p for p in (workdir / "checkpoints").rglob("*") if "orbax-checkpoint-tmp" in p.name]
    assert left == [], left  # unfinished saves were cleaned up
    text = (workdir / "metrics.jsonl").read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    assert (workdir / workdir_lock.LOCK_FILE).read_text() == ""  # released at the end
