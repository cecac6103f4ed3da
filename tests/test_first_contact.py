"""What a newcomer reads first (issue 36): every failure is one clear line, fast.

The hub looked up once (the local cache, then one request, no retries; HF_HUB_OFFLINE
honoured), damaged checkpoints named without TensorStore's text, warnings on one line, reports
that mark an untrained story choice, no backend noise on CPU; and each README command's failure
path, run as a subprocess, shows a person at most two lines besides the log.
"""

from __future__ import annotations

import asyncio
import gc
import http.server
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import traceback
import warnings

import pytest
from absl import logging as absl_logging
from etils import epath

from trip_jax.data import tokenizers
from trip_jax.data.record_checks import TripDataWarning
from trip_jax.evaluation import reports
from trip_jax.models import weights
from trip_jax.runtime import hub, jax_setup, terminal, workdir_lock
from trip_jax.training import checkpoint_reads, checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An absl log line: "I1203 05:48:09.530151 140647095221120 file.py:266] ...".
LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
ABSENT = "trip-jax-tests/no-such-model"  # a hub name no cache holds


class Loader:
    """A stand-in for a hub load: records each call's local_files_only; ``cached`` says
    whether the cache holds the files."""

    def __init__(self, cached: bool = False):
        self.cached, self.calls = cached, []

    def __call__(self, local_files_only: bool):
        self.calls.append(local_files_only)
        if local_files_only and not self.cached:
            raise FileNotFoundError("not in the cache")
        return "files"


@pytest.fixture
def hub_online(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def answering_hub(monkeypatch, hub_online):
    """A local HTTP server standing in for the hub; yields the list of requests it got."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            requests.append(self.command)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield requests
    server.shutdown()


@pytest.fixture
def silent_hub(monkeypatch, hub_online):
    """A hub that accepts connections and never answers (a firewall that drops replies);
    yields the list of connections it accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(hub, "PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield accepted
    listener.close()
    for connection in accepted:
        connection.close()


def assert_hub_line(message: str, name: str, flag: str) -> None:
    assert "\n" not in message
    assert f"could not load {name!r}" in message
    assert "local Hugging Face cache" in message  # what was tried: the cache ...
    assert "hub" in message.split("cache", 1)[1]  # ... and the hub
    assert f"{flag}=DIR" in message and f"hf download {name}" in message  # the two ways out


def test_a_cached_name_never_asks_the_hub(silent_hub):
    load = Loader(cached=True)
    assert hub.fetch("roberta-large", load) == "files"
    assert load.calls == [True] and silent_hub == []


def test_offline_stops_after_the_cache(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load = Loader()
    with pytest.raises(hub.HubUnavailableError) as err:
        hub.fetch("roberta-large", load, flag="--config.model.encoder")
    assert load.calls == [True]
    assert "switched off (HF_HUB_OFFLINE)" in str(err.value)
    assert_hub_line(str(err.value), "roberta-large", "--config.model.encoder")
    assert err.value.exit_code == 2


def test_a_silent_hub_is_asked_once(silent_hub):
    load = Loader()
    with pytest.raises(hub.HubUnavailableError) as err:
        hub.fetch("roberta-large", load)
    assert load.calls == [True]  # never the online load with its retries
    assert len(silent_hub) == 1  # one connection: no retry
    assert "cannot be reached" in str(err.value)
    assert_hub_line(str(err.value), "roberta-large", "--config.model.encoder")


def test_an_answering_hub_gets_the_online_load(answering_hub):
    load = Loader()
    assert hub.fetch("roberta-large", load) == "files"
    assert load.calls == [True, False] and answering_hub == ["HEAD"]


def test_tokenizer_and_weights_of_an_absent_name_fail_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubUnavailableError) as err:
        tokenizers.load_tokenizer(ABSENT, flag="--config.model.encoder")
    assert_hub_line(str(err.value), ABSENT, "--config.model.encoder")
    with pytest.raises(hub.HubUnavailableError) as err:
        weights.load_pretrained(ABSENT, cache_dir=tmp_path)
    assert_hub_line(str(err.value), ABSENT, "--config.model.encoder")
    assert str(tmp_path) in str(err.value)  # the cache it looked in


def test_the_tokenizer_flag_follows_the_config():
    import ml_collections

    seen = {}
    model = ml_collections.ConfigDict({"tokenizer": "", "encoder": ABSENT})
    for key in ("encoder", "tokenizer"):
        model.tokenizer = ABSENT if key == "tokenizer" else ""
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HF_HUB_OFFLINE", "1")
            with pytest.raises(hub.HubUnavailableError) as err:
                tokenizers.build_tokenizer(model, [])
        seen[key] = str(err.value)
    assert "--config.model.encoder=DIR" in seen["encoder"]
    assert "--config.model.tokenizer=DIR" in seen["tokenizer"]


@pytest.fixture
def terminal_set_up():
    """``terminal.setup()`` over Python's own unraisable hook, for one test: the warning format,
    the unraisable hook (pytest's, which collects the later tests' unraisable exceptions), the
    asyncio filter and the checkpoints noted as abandoned are restored afterwards."""
    saved, saved_hook = warnings.formatwarning, sys.unraisablehook
    asyncio_filters = list(logging.getLogger("asyncio").filters)
    aborted = list(terminal._ABORTED_READS)
    sys.unraisablehook = sys.__unraisablehook__
    terminal.setup()
    yield
    warnings.formatwarning, sys.unraisablehook = saved, saved_hook
    logging.getLogger("asyncio").filters[:] = asyncio_filters
    terminal._ABORTED_READS[:] = aborted


def test_warnings_print_as_one_line(terminal_set_up):
    data = warnings.formatwarning(
        TripDataWarning("data/test.jsonl: 5 stories have states for fewer sentences"),
        TripDataWarning, "/x/trip_jax/data/readers.py", 365, "    return read_pairs(path)")
    other = warnings.formatwarning("a library's\nmessage", DeprecationWarning, "/y/lib.py", 7,
                                   "    source()")
    assert data == "warning: data/test.jsonl: 5 stories have states for fewer sentences\n"
    assert other == "warning: DeprecationWarning: a library's message (/y/lib.py:7)\n"


def unraisable(err: BaseException):
    """An ``unraisablehook`` argument for ``err`` (raised in no particular object)."""
    return type("U", (), {"exc_type": type(err), "exc_value": err, "object": None,
                          "exc_traceback": err.__traceback__, "err_msg": None})()


class Pending:
    """An awaitable that never completes (a TensorStore read still under way)."""

    def __await__(self):
        yield


def abandon_read(filename: str, name: str) -> None:
    """Leaves a suspended coroutine ``name``, compiled as if in ``filename``, to be finalized
    like orbax's reads: on GeneratorExit it raises, which Python reports as unraisable."""
    scope = {}
    source = (f"async def {name}(pending):\n    try:\n        await pending\n"
              "    except BaseException as e:\n"
              "        raise Exception('Encountered error while reading array') from e\n")
    exec(compile(source, filename, "exec"), scope)
    coroutine = scope[name](Pending())
    coroutine.send(None)
    del coroutine  # finalized here: sys.unraisablehook gets the exception


def test_leftovers_of_an_aborted_read_go_to_the_debug_log(terminal_set_up, caplog, capsys):
    orbax_file = os.path.join(os.sep, "x", "orbax", "checkpoint", "serialization.py")
    with caplog.at_level(logging.DEBUG):
        sys.unraisablehook(unraisable(RuntimeError("Event loop is closed")))
        abandon_read(orbax_file, "_read_array_index_and_device_put")
        quiet_err = capsys.readouterr().err
        abandon_read(os.path.join(os.sep, "x", "mine.py"), "reader")  # not orbax's: shown
        shown_err = capsys.readouterr().err
        asyncio_logger = logging.getLogger("asyncio")
        asyncio_logger.error("Task was destroyed but it is pending!\ntask: <Task pending "
                             f"coro=<_read_and_create_array() running at {orbax_file}:350>>")
        asyncio_logger.error("Task exception was never retrieved: mine")
    assert quiet_err == ""
    assert "Exception ignored in: <coroutine object reader" in shown_err
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("ignored after an aborted checkpoint read" in m for m in debug) == 3, debug
    assert any("Event loop is closed" in m for m in debug)
    assert any("Encountered error while reading array" in m for m in debug)
    shown = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert shown == ["Task exception was never retrieved: mine"]


class FailingOpen:
    """An awaitable, not a coroutine, that fails like TensorStore opening an array of a damaged
    checkpoint (``asyncio.gather`` wraps it in a task whose traceback names no orbax code)."""

    def __init__(self, message: str):
        self.message = message

    def __await__(self):
        raise ValueError(self.message)
        yield  # a generator: awaitable


def leave_a_gathered_failure(message: str) -> None:
    """Leaves a gather of ``FailingOpen(message)`` that nobody awaits, as a read given up on
    leaves its other arrays' opens: collected, it logs "exception was never retrieved" with the
    traceback through asyncio's ``_wrap_awaitable``."""

    async def abandon():
        asyncio.gather(FailingOpen(message))
        for _ in range(3):
            await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(abandon())
    loop.close()
    gc.collect()


def test_an_abandoned_checkpoints_other_reads_go_to_the_debug_log(terminal_set_up, caplog,
                                                                   tmp_path):
    where = tmp_path / "damaged" / "checkpoints" / "selected" / "4"
    message = (f'DATA_LOSS: Error reading "a/.zarray" in OCDBT database at local file '
               f'"{where}/params/"')
    with caplog.at_level(logging.DEBUG):
        leave_a_gathered_failure(message)  # before any read was given up on: shown
        shown = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
        assert len(shown) == 1 and "never retrieved" in shown[0].getMessage()
        assert "_wrap_awaitable" in "".join(traceback.format_exception(*shown[0].exc_info))
        checkpoint_reads._damaged(ValueError(message), epath.Path(where), ["params"])
        leave_a_gathered_failure(message)
        leave_a_gathered_failure(message.replace(str(where), str(tmp_path / "other")))
    # After it, the errors naming that checkpoint are quiet; another checkpoint's are not.
    shown = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert [str(tmp_path / "other") in str(r.exc_info[1]) for r in shown] == [False, True]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("ignored after an aborted checkpoint read" in m for m in debug) == 1, debug


def test_backend_search_is_quiet_unless_debugging():
    logger = logging.getLogger(jax_setup.BACKEND_LOGGER)
    # set_verbosity also sets the absl logger's own level: that is restored as it was (NOTSET
    # by default) after the verbosity, which alone left it at WARNING for later tests.
    absl_logger = logging.getLogger("absl")
    level, verbosity, absl_level = logger.level, absl_logging.get_verbosity(), absl_logger.level
    try:
        for setting, hidden in ((absl_logging.INFO, True), (absl_logging.DEBUG, False)):
            logger.setLevel(logging.NOTSET)
            absl_logging.set_verbosity(setting)
            jax_setup.quiet_backend_search()
            assert logger.level == (logging.WARNING if hidden else logging.NOTSET)
    finally:
        logger.setLevel(level)
        absl_logging.set_verbosity(verbosity)
        absl_logger.setLevel(absl_level)


def decoding_metrics():
    import test_reports

    scores, _ = test_reports.scored()
    tiers = {f"{method}/{tier}": scores[tier] for method in ("independent", "coherent")
             for tier in ("accuracy", "consistency", "verifiability")}
    return {**scores, **tiers, "decoding": "coherent"}


def test_reports_mark_a_story_choice_no_loss_trained():
    metrics = decoding_metrics()
    untrained = reports.markdown_summary("test", metrics, {"story_loss_weight": 0.0})
    assert "| independent (story choice untrained) |" in untrained
    assert "| coherent |" in untrained
    assert "story loss weight 0" in untrained
    headline = reports.markdown_summary("test", {**metrics, "decoding": "independent"},
                                        {"story_loss_weight": 0.0})
    assert "untrained" not in headline  # the paper's own omit_story reading
    for metadata in ({"story_loss_weight": 0.05}, {}):  # trained, or unknown (a scored file)
        text = reports.markdown_summary("test", metrics, metadata)
        assert "untrained" not in text and "| independent |" in text


def flip(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def damaged_workdir(trained_workdir, tmp_path_factory):
    """A copy of the trained tiny run whose selected checkpoint has a damaged OCDBT manifest
    (TensorStore fails reading every array)."""
    workdir = tmp_path_factory.mktemp("contact") / "damaged"
    shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("eval"))
    step = max((workdir / "checkpoints" / "selected").glob("[0-9]*"), key=lambda p: int(p.name))
    flip(step / "params" / "manifest.ocdbt")
    return workdir, step


def test_a_headline_decoding_is_not_marked_in_a_run_report(trained_workdir):
    config = json.loads((trained_workdir / "config.json").read_text())
    assert config["loss"]["story_weight"] == 0  # tiny.py's default loss preset, omit_story
    # tiny.py decodes with "independent", as the paper's omit_story model did: its headline row
    # is not marked (test_coherent covers the mark beside a coherent headline).
    report = (trained_workdir / "reports" / "test.md").read_text()
    assert "untrained" not in report and "| independent |" in report


def test_a_damaged_checkpoint_is_one_line_without_tensorstore(damaged_workdir, caplog):
    workdir, step = damaged_workdir
    with caplog.at_level(logging.DEBUG, logger="absl"):
        with pytest.raises(checkpoints.DamagedCheckpointError) as err:
            checkpoints.restore_for_eval(str(workdir))
    message = str(err.value)
    assert re.fullmatch(rf"checkpoint {re.escape(str(step))} is damaged or unreadable: could "
                        r"not restore its array [\w.]+, file params/manifest\.ocdbt \(.*\)",
                        message), message
    assert "tensorstore" not in message.lower() and "{" not in message
    causes = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert any("manifest.ocdbt" in str(r.exc_info[1]) for r in causes), causes


def test_unreadable_part_without_a_tensorstore_message(tmp_path):
    where = tmp_path / "4"
    assert checkpoint_reads.unreadable_part(UnicodeDecodeError("utf-8", b"\x99", 0, 1, "bad"),
                                            where, ["meta"]) == "meta/ folder"


def terminal_lines(result: subprocess.CompletedProcess) -> list[str]:
    """What a person reads on the terminal besides the log: stdout and stderr, log lines out."""
    return [line for line in (result.stdout + result.stderr).splitlines()
            if line.strip() and not LOG_LINE.match(line)]


def test_each_readme_command_fails_in_at_most_two_lines(damaged_workdir, data_dir, tmp_path,
                                                        main_job_env):
    """The README's commands, each on its failure path, run side by side (each python start
    with jax costs seconds): no network, missing data, a bad value, a busy workdir, a damaged
    checkpoint, a data command on a missing directory."""
    main = [sys.executable, "-m", "trip_jax.main"]
    tiny = [*main, "--config=configs/tiny.py", f"--config.data.data_dir={data_dir}"]
    busy = tmp_path / "busy"
    cases = {  # name: (command, extra environment, exit status, what the error line says)
        "no network": ([*main, "--config=configs/roberta.py", f"--workdir={tmp_path / 'r'}"],
                       {"HF_HOME": str(tmp_path / "hf_empty"), "TRIP_DATA_DIR": data_dir}, 2,
                       "could not load 'roberta-large'"),
        "missing data": ([*main, "--config=configs/tiny.py", f"--workdir={tmp_path / 'm'}",
                          f"--config.data.data_dir={tmp_path / 'no_data'}"], {}, 1,
                         str(tmp_path / "no_data")),
        "bad value": ([*tiny, f"--workdir={tmp_path / 'b'}", "--config.train.learning_rate=-1"],
                      {}, 2, "learning_rate"),
        "busy workdir": ([*tiny, f"--workdir={busy}"], {}, 2, str(os.getpid())),
        "damaged checkpoint": ([*tiny, f"--workdir={damaged_workdir[0]}", "--mode=evaluate"],
                               {}, 1, "is damaged or unreadable"),
        "data stats": ([sys.executable, "-m", "trip_jax.datatools", "stats",
                        f"--data_dir={tmp_path / 'no_data'}"], {}, 1, str(tmp_path / "no_data")),
    }
    base = main_job_env()
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        base.pop(key, None)  # the hub is tried, and cannot be reached
    busy.mkdir()
    with workdir_lock.acquire(str(busy)):
        running = {name: subprocess.Popen(command, cwd=REPO, env={**base, **env},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                   for name, (command, env, _, _) in cases.items()}
        results = {}
        for name, process in running.items():
            out, err = process.communicate(timeout=600)
            results[name] = subprocess.CompletedProcess(process.args, process.returncode,
                                                        out, err)
    for name, (_, _, status, says) in cases.items():
        result = results[name]
        lines = terminal_lines(result)
        assert result.returncode == status, (name, result.stderr[-3000:])
        assert len(lines) <= 2, (name, lines)
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1 and says in errors[0], (name, lines)
        assert "Traceback" not in result.stderr, name
        assert "Unable to initialize backend" not in result.stderr, name
    offline = results["no network"]
    assert "Retrying" not in offline.stderr  # no retry storm
    assert_hub_line(terminal_lines(offline)[-1].removeprefix("error: "), "roberta-large",
                    "--config.model.encoder")


# Where the flips of ``flip_every`` start: the offsets of issue 46, some of which left orbax's
# reads pending as the interpreter shut down (a traceback per array, thousands of lines).
FLIP_STARTS = (0, 13, 900)
FLIP_STRIDE = 997


def flip_every(path, start: int, stride: int = FLIP_STRIDE) -> None:
    """Inverts every ``stride``-th byte of the file ``path`` from ``start`` on."""
    data = bytearray(path.read_bytes())
    for i in range(start, len(data), stride):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_evaluate_on_a_checkpoint_damaged_anywhere_is_one_line(trained_workdir, data_dir,
                                                               tmp_path, main_job_env):
    """--mode=evaluate on copies of the trained run, each with the largest array file of its
    selected checkpoint damaged from one of FLIP_STARTS, run side by side."""
    command = [sys.executable, "-m", "trip_jax.main", "--config=configs/tiny.py",
               f"--config.data.data_dir={data_dir}", "--mode=evaluate"]
    env = main_job_env()
    running = {}
    for start in FLIP_STARTS:
        workdir = tmp_path / f"from{start}"
        shutil.copytree(trained_workdir, workdir, ignore=shutil.ignore_patterns("eval"))
        step = max((workdir / "checkpoints" / "selected").glob("[0-9]*"),
                   key=lambda p: int(p.name))
        arrays = (step / "params" / "ocdbt.process_0" / "d").iterdir()
        flip_every(max(arrays, key=lambda p: p.stat().st_size), start)
        running[start] = (step, subprocess.Popen(
            [*command, f"--workdir={workdir}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    for start, (step, process) in running.items():
        out, err = process.communicate(timeout=600)
        result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        lines = terminal_lines(result)
        assert result.returncode == 1, (start, err[-3000:])
        assert len(lines) <= 2, (start, len(lines), lines[:8])
        assert lines[-1].startswith(f"error: checkpoint {step} is damaged"), (start, lines)
        assert "Exception ignored" not in err and "Traceback" not in err, start
