"""Runs a Python function in N local JAX processes joined by ``jax.distributed`` (CPU, gloo).

``run_processes("module:function", 2, kwargs={...})`` starts N interpreters on this machine, each
with ``devices_per_process`` CPU devices and the TRIP_* variables that make
``trip_jax.runtime.distributed.initialize_distributed`` join a localhost coordinator; each calls
``function(**kwargs)`` after joining and writes its JSON-serialisable return value to a file. The
results come back ordered by process id. A process that fails stops the others at once; a run
that outlasts ``timeout_s`` is killed. Both raise ``MultiprocessError`` with every process's log.

The module must be importable in the children: the repository root and this tests/ folder are on
their PYTHONPATH (add others with ``pythonpath``). Run as a script, this file is the child.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
_LOG_TAIL_CHARS = 4000
# Read by trip_jax.runtime.distributed (and jax); set here for the children only.
_CLUSTER_VARS = ("TRIP_DISTRIBUTED", "TRIP_COORDINATOR_ADDRESS", "TRIP_NUM_PROCESSES",
                 "TRIP_PROCESS_ID", "TRIP_LOCAL_DEVICE_IDS", "TRIP_COORDINATOR_PORT",
                 "JAX_COORDINATOR_ADDRESS")


class MultiprocessError(RuntimeError):
    """A child failed or the run timed out; the message holds each child's log tail.

    ``pids`` are the children's process ids (all ended and reaped when this is raised).
    """

    def __init__(self, message: str, pids: tuple[int, ...] = ()):
        super().__init__(message)
        self.pids = pids


class MultiprocessTimeout(MultiprocessError):
    """The run outlasted its timeout; every child was killed."""


@dataclasses.dataclass
class _Child:
    process_id: int
    popen: subprocess.Popen
    log_path: Path
    out_path: Path

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-_LOG_TAIL_CHARS:]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(process_id: int, num_processes: int, port: int, devices_per_process: int,
               pythonpath: list[str], extra_env: dict[str, str]) -> dict[str, str]:
    # The parent's own cluster settings must not leak into the children (TRIP_DATA_DIR etc. do).
    env = {k: v for k, v in os.environ.items()
           if k not in _CLUSTER_VARS and not k.startswith("SLURM_")}
    # The caller's XLA_FLAGS (else the parent's), with this harness's device count.
    xla_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                       extra_env.get("XLA_FLAGS", env.get("XLA_FLAGS", ""))).strip()
    env.update({
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{xla_flags} --xla_force_host_platform_device_count={devices_per_process}"
                     .strip(),
        "TRIP_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "TRIP_NUM_PROCESSES": str(num_processes),
        "TRIP_PROCESS_ID": str(process_id),
        "PYTHONPATH": os.pathsep.join(filter(None, [
            str(REPO_ROOT), str(TESTS_DIR), *pythonpath, extra_env.get("PYTHONPATH"),
            env.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k: v for k, v in extra_env.items() if k not in ("XLA_FLAGS", "PYTHONPATH")})
    return env


def _kill(children: list[_Child]) -> None:
    for child in children:
        if child.popen.poll() is None:
            try:  # each child leads its own session (start_new_session), so this is its group
                os.killpg(child.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for child in children:
        child.popen.wait()


def _pids(children: list[_Child]) -> tuple[int, ...]:
    return tuple(c.popen.pid for c in children)


def _report(headline: str, children: list[_Child]) -> str:
    parts = [headline]
    for child in children:
        parts.append(f"--- process {child.process_id} (exit code {child.popen.returncode}), "
                     f"log tail {child.log_path}:\n{child.log_tail()}")
    return "\n".join(parts)


def run_processes(target: str, num_processes: int = 2, *, kwargs: dict | None = None,
                  devices_per_process: int = 2, timeout_s: float = 120.0,
                  env: dict[str, str] | None = None, pythonpath: list[str] | None = None,
                  log_dir: str | os.PathLike | None = None) -> list:
    """Runs ``target`` ("module:function") in ``num_processes`` joined processes.

    Returns the function's return values (JSON round-tripped) ordered by process id. ``env`` is
    added to each child's environment (after the TRIP_* variables, so it can override them; its
    XLA_FLAGS replace the parent's, the device count staying ``devices_per_process``; its
    PYTHONPATH comes after the harness's folders and ``pythonpath``);
    ``log_dir`` keeps the per-process logs (default: a temporary folder, removed).
    Raises MultiprocessTimeout after ``timeout_s`` seconds, MultiprocessError when a child fails.
    """
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    with tempfile.TemporaryDirectory(prefix="trip_mp_") as tmp:
        folder = Path(log_dir) if log_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        # Children give up waiting for each other before the harness gives up on them.
        init_timeout = max(5, int(timeout_s) - 5)
        children = []
        try:
            for pid in range(num_processes):
                log_path = folder / f"process_{pid}.log"
                out_path = folder / f"process_{pid}.json"
                out_path.unlink(missing_ok=True)  # never read a result of an earlier run
                cmd = [sys.executable, str(Path(__file__).resolve()), "--target", target,
                       "--kwargs", json.dumps(kwargs or {}), "--out", str(out_path),
                       "--init-timeout", str(init_timeout)]
                child_env = _child_env(pid, num_processes, port, devices_per_process,
                                       list(pythonpath or []), dict(env or {}))
                with open(log_path, "wb") as log:
                    popen = subprocess.Popen(cmd, env=child_env, cwd=REPO_ROOT, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
                children.append(_Child(pid, popen, log_path, out_path))
            deadline = time.monotonic() + timeout_s
            # Poll every child each round (any() would stop at the first running one).
            while None in [c.popen.poll() for c in children]:
                failed = [c for c in children if c.popen.returncode not in (None, 0)]
                if failed:
                    _kill(children)
                    raise MultiprocessError(_report(
                        f"process {failed[0].process_id} of {target} failed", children),
                        _pids(children))
                if time.monotonic() > deadline:
                    _kill(children)
                    raise MultiprocessTimeout(_report(
                        f"{target} in {num_processes} processes timed out after {timeout_s:g} s;"
                        " all processes were killed", children), _pids(children))
                time.sleep(0.1)
            if any(c.popen.returncode != 0 for c in children):
                raise MultiprocessError(_report(f"a process of {target} failed", children),
                                        _pids(children))
            return [json.loads(c.out_path.read_text()) for c in children]
        finally:
            _kill(children)


def _child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="one process of run_processes")
    parser.add_argument("--target", required=True)
    parser.add_argument("--kwargs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--init-timeout", type=int, required=True)
    args = parser.parse_args(argv)

    import jax
    from absl import logging

    from trip_jax.runtime.distributed import initialize_distributed

    logging.set_verbosity(logging.INFO)  # the plan's log line lands in the process log
    initialize_distributed(initialization_timeout=args.init_timeout)
    module_name, function_name = args.target.split(":", 1)
    try:
        result = getattr(importlib.import_module(module_name), function_name)(
            **json.loads(args.kwargs))
    except BaseException:
        # A normal exit would run jax.distributed's shutdown, which waits (minutes) for the
        # other processes; exit at once so that the harness sees the failure and stops them.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)  # the harness never reads a half-written result
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


if __name__ == "__main__":
    _child_main(sys.argv[1:])
