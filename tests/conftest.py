"""Shared fixtures: the TRIP data directory, the compilation cache, the tiny config, layouts, a
trained tiny run, the environment of the main install for subprocesses, a Python parser, and the
helper modules of the tests (small TRIP files, the multi-process harness).

Test modules get all of these as fixtures; none imports another test module.
"""

from __future__ import annotations

import ast
import gc
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable

from trip_jax.runtime import platforms

platforms.skip_absent_tpu()  # before JAX starts: an installed libtpu is not tried without a TPU
import jax  # noqa: E402
import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
# XLA:CPU compile time of the tests' tiny programs: LLVM's optimisations (-O0 drops them) and the
# MLIR fusion emitters (the older emitters compile a train step in ~0.6x the time) dominate it.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def _with_test_flags(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with TEST_XLA_FLAGS added unless they are there."""
    return flags if TEST_XLA_FLAGS in flags else f"{flags} {TEST_XLA_FLAGS}".strip()


# On a machine with no accelerator attached (an installed libtpu or CUDA plugin alone does not
# count) every test process (subprocesses inherit it) compiles with TEST_XLA_FLAGS
# (docs/reference.md#tests).
if platforms.attached_platforms() == "cpu":
    os.environ["XLA_FLAGS"] = _with_test_flags(os.environ.get("XLA_FLAGS", ""))
# XLA reads XLA_FLAGS once, when the first backend starts, and keeps them for the process; the
# compilation cache keys on XLA_FLAGS as it is at each compilation. Start the backend now, so
# that a test which sets XLA_FLAGS for its subprocesses cannot fix them for the rest of this
# worker: its programs would then be compiled under other flags than their cache keys name.
jax.devices()
# Tracing allocates many short-lived objects: with Python's default thresholds (700, 10, 10) the
# collector ran 5,900 times in test_train, test_tiered and test_layer_stack (9 s); with these and
# the modules frozen after collection, 49 times (3 s); docs/reference.md#tests.
gc.set_threshold(50_000, 50, 100)


# The longest modules, longest first (bd060f8's run, docs/reference.md#tests); the others follow in
# their usual order. xdist hands whole modules to the workers in collection order
# (pyproject's --no-loadscope-reorder): the long ones start early and the short ones even out the
# end. The multi-device modules are far apart, so that they do not run at the same time.
LONGEST_FIRST = (
    "test_multiprocess_training.py", "test_benchmarks.py", "test_compile.py", "test_train.py",
    "test_faults.py", "test_convert.py", "test_gpu_check.py", "test_sharding.py",
    "test_cross_validate.py", "test_evaluate.py", "test_real_cells.py", "test_ensemble.py",
    "test_coherent.py", "test_layer_stack.py", "test_t5.py", "test_exact_reference.py",
    "test_export.py", "test_modernbert.py", "test_first_contact.py", "test_tiered.py",
    "test_explorer.py")


def pytest_configure(config):
    """Stops the run when LONGEST_FIRST names no module in tests/ (a renamed module would
    otherwise lose its place silently)."""
    stale = [name for name in LONGEST_FIRST if not (REPO / "tests" / name).is_file()]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: LONGEST_FIRST names {', '.join(stale)}, "
                                "which is not a module in tests/")


def pytest_collection_modifyitems(session, config, items):
    """Puts the modules of LONGEST_FIRST first, in that order (a stable sort: the tests of a
    module and the other modules keep their order)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):
    """Freezes what the imports of the test modules made: the collector skips it from now on."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _keep_default_prng_impl():
    """Restores JAX's default PRNG after each test: a command run in this process (e.g.
    benchmarks.unroll_encoder, which sets rbg) must not change the dropout masks of later
    tests' runs (test_faults' resume once came out 1e-4 off ``trained_workdir`` that way)."""
    from trip_jax.runtime import jax_setup

    with jax_setup.prng_impl(jax.config.jax_default_prng_impl):
        yield


def _data_dir() -> str:
    """The shared TRIP data: $TRIP_DATA_DIR, else ../shared/data/trip next to the repository."""
    return os.environ.get("TRIP_DATA_DIR") or str(REPO.parent / "shared" / "data" / "trip")


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> str:
    """The directory of the TRIP data files the tests read."""
    return _data_dir()


@pytest.fixture(scope="session")
def compilation_cache_dir(tmp_path_factory) -> pathlib.Path:
    """The session's persistent JAX compilation cache (shared with subprocesses)."""
    return tmp_path_factory.getbasetemp() / "jax_cache"


@pytest.fixture(scope="module")
def highest_matmul_precision():
    """Every matmul traced in this module at full float32 (``jax.default_matmul_precision``), so
    that parity with PyTorch's float32 holds on a GPU too, whose default is TF32."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def compilation_cache(compilation_cache_dir):
    """Lets every compilation after the first in this session load from disk (this module
    only: the settings are restored afterwards)."""
    from trip_jax.runtime import jax_setup

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    saved = {key: getattr(jax.config, key) for key in keys}
    jax_setup.enable_compilation_cache(str(compilation_cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # tiny programs too
    yield compilation_cache_dir
    for key, value in saved.items():
        jax.config.update(key, value)


@pytest.fixture(scope="session")
def test_xla_flags() -> str:
    """XLA_FLAGS for the CPU programs of a test's subprocesses on any machine (as every test
    process gets on a CPU-only install): fast compilation, nothing about speed is asserted."""
    return TEST_XLA_FLAGS


@pytest.fixture
def benchmark_env(monkeypatch, data_dir):
    """The benchmark processes a test starts read the shared TRIP data, compile with
    TEST_XLA_FLAGS (as every test process on a CPU-only install; here on any machine: no timing
    is asserted) and have no torch unless they run the PyTorch reference
    (``tests/benchmark_install``). This process keeps its flags (``jax.devices()`` above) and
    its torch."""
    from jax._src import xla_bridge

    assert xla_bridge.backends_are_initialized(), "XLA_FLAGS set now would stay in this worker"
    monkeypatch.setenv("TRIP_DATA_DIR", data_dir)
    monkeypatch.setenv("XLA_FLAGS", _with_test_flags(os.environ.get("XLA_FLAGS", "")))
    paths = [str(REPO / "tests" / "benchmark_install"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@pytest.fixture(scope="session")
def tiny_config(data_dir) -> Callable:
    """A factory of configs/tiny.py on the shared data, with synchronous checkpoints (exact
    kill points); each call returns a fresh copy to change."""
    from configs import tiny

    def make(argument: str | None = None):
        config = tiny.get_config(argument)
        config.data.data_dir = data_dir
        config.train.async_checkpoints = False
        return config

    return make


@pytest.fixture(scope="session")
def make_layout() -> Callable:
    """``make_layout(name="packed_tokens", **fields)``: the layout of configs/base.py's data
    section (clean fidelity) with ``data.layout = name``, its fields replaced by ``fields``."""
    import dataclasses

    from configs import base
    from trip_jax.data import layouts

    def make(name: str = "packed_tokens", **fields):
        data = base.get_config().data
        data.layout = name
        return dataclasses.replace(layouts.from_config(data), **fields)

    return make


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory, tiny_config, compilation_cache) -> pathlib.Path:
    """A finished tiny run (1 epoch, 4 steps), trained once per session whichever module asks
    first."""
    from trip_jax import train

    workdir = tmp_path_factory.getbasetemp() / "trained_tiny"
    done = workdir / "TRAINED"
    if not done.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        config = tiny_config()
        config.train.num_epochs = 1
        train.train_and_evaluate(config, str(workdir))
        done.touch()
    return workdir


@pytest.fixture(scope="session")
def main_install() -> Callable[[dict[str, str]], dict[str, str]]:
    """``main_install(env)``: ``env`` with ``tests/main_install`` first on PYTHONPATH, for a
    subprocess that runs a command of the main job as the main install has it: without torch,
    which only the tests need (transformers would import it at every start: about 2 s)."""

    def environment(env: dict[str, str]) -> dict[str, str]:
        paths = [str(REPO / "tests" / "main_install"), env.get("PYTHONPATH", "")]
        return {**env, "PYTHONPATH": os.pathsep.join(filter(None, paths))}

    return environment


@pytest.fixture(scope="session")
def main_job_env(compilation_cache_dir, main_install) -> Callable[..., dict[str, str]]:
    """``main_job_env(**extra)``: the environment of a subprocess that runs a command of the main
    job: this process's, with the session's compilation cache (every program: no minimum
    compile time), as the main install has it (``main_install``), and ``extra`` set."""

    def environment(**extra: str) -> dict[str, str]:
        return main_install({**os.environ, "JAX_COMPILATION_CACHE_DIR": str(compilation_cache_dir),
                             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **extra})

    return environment


@pytest.fixture(scope="session")
def run_main(data_dir, main_job_env) -> Callable[..., subprocess.CompletedProcess]:
    """``run_main(*flags, env=None)``: ``python -m trip_jax.main --config=configs/tiny.py`` on the
    shared data (unless ``flags`` set ``--config.data.data_dir``), in ``main_job_env``; ``env``
    adds environment variables."""

    def run(*flags: str, env: dict[str, str] | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess:
        env = main_job_env(**(env or {}))
        if not any(flag.startswith("--config.data.data_dir=") for flag in flags):
            flags = (f"--config.data.data_dir={data_dir}", *flags)
        command = [sys.executable, "-m", "trip_jax.main", "--config=configs/tiny.py", *flags]
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)

    return run


@pytest.fixture(scope="session")
def parse_python() -> Callable[[str], ast.Module]:
    """``parse_python(source)``: ``ast.parse(source)`` with the garbage collector paused. A
    full run once failed test_imports with Python 3.11's "AST constructor recursion depth
    mismatch" (python/cpython#106905), right after asyncio logged "Task exception was never
    retrieved" for a checkpoint read another test gave up; formatting that traceback parses
    source too (3.11 places its ^ marks so), and a finalizer that a collection runs mid-parse
    is the likely way in. Not reproduced on demand."""

    def parse(source: str) -> ast.Module:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source)
        finally:
            if enabled:
                gc.enable()

    return parse


@pytest.fixture(scope="session")
def fx():
    """``tests/trip_files.py``: small TRIP files in the three formats."""
    import trip_files

    return trip_files


@pytest.fixture(scope="session")
def multiprocess():
    """``tests/multiprocess_harness.py``: runs a function in N local JAX processes."""
    import multiprocess_harness

    return multiprocess_harness
