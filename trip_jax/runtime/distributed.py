"""Decides how this process joins a multi-process JAX run, and joins it (``jax.distributed``).

The first that applies wins: ``TRIP_DISTRIBUTED=off``, explicit ``TRIP_*`` variables, a SLURM
task, a Cloud TPU VM, else one process. Details: docs/reference.md#hand-written-parts-and-why.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

import jax
from absl import logging

ENV_MODE = "TRIP_DISTRIBUTED"
ENV_COORDINATOR = "TRIP_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "TRIP_NUM_PROCESSES"
ENV_PROCESS_ID = "TRIP_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "TRIP_LOCAL_DEVICE_IDS"
ENV_COORDINATOR_PORT = "TRIP_COORDINATOR_PORT"
_EXPLICIT_VARS = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
_SLURM_TASK_VARS = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID")
_OFF_VALUES = ("off", "0", "false", "no", "none", "single")

# Methods that call jax.distributed.initialize.
MULTI_PROCESS_METHODS = ("explicit", "slurm", "tpu")


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    """What ``initialize_distributed`` decided: a method, why, and the arguments it passes.

    method is one of "single", "already" (jax.distributed was initialised before), "explicit",
    "slurm" or "tpu". For "tpu" the process count and id are left to jax (None here).
    """

    method: str
    reason: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None

    @property
    def multi_process(self) -> bool:
        """True when this plan calls ``jax.distributed.initialize``."""
        return self.method in MULTI_PROCESS_METHODS

    def initialize_kwargs(self) -> dict:
        """Keyword arguments for ``jax.distributed.initialize`` (none for TPU auto-detection)."""
        if self.method == "tpu":
            return {}
        if not self.multi_process:
            raise ValueError(f"plan {self.method!r} does not initialise jax.distributed")
        return dict(
            coordinator_address=self.coordinator_address,
            num_processes=self.num_processes,
            process_id=self.process_id,
            local_device_ids=(list(self.local_device_ids)
                              if self.local_device_ids is not None else None),
            # Every argument is given: keep jax's cluster detection from overriding
            # local_device_ids (its SLURM rule pins each process to a single GPU).
            cluster_detection_method="deactivate",
        )

    def describe(self) -> str:
        """One log line: the method, the reason and the arguments."""
        if not self.multi_process:
            return f"{self.method} ({self.reason}): jax.distributed.initialize not called"
        if self.method == "tpu":
            return f"tpu ({self.reason}): jax.distributed.initialize() with TPU auto-detection"
        devices = "all" if self.local_device_ids is None else list(self.local_device_ids)
        return (f"{self.method} ({self.reason}): process {self.process_id} of "
                f"{self.num_processes}, coordinator {self.coordinator_address}, "
                f"local devices {devices}")


def _int_var(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _device_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{ENV_LOCAL_DEVICE_IDS} must be comma-separated integers, "
                         f"got {text!r}") from None


def _check_address(address: str, source: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{source} must be HOST:PORT, got {address!r}")
    return address


def _check_rank(process_id: int, num_processes: int, source: str) -> None:
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"{source}: need 0 <= process id < process count, got process id "
                         f"{process_id} of {num_processes}")


def first_hostname(nodelist: str) -> str:
    """First host of a SLURM node list such as ``gpu[003-010,012],cpu1`` (→ ``gpu003``).

    Each bracket keeps the first number of its first range (zero padding included), so
    ``rack[2-3]-n[07-09]`` gives ``rack2-n07``: the host SLURM lists, and starts task 0 on, first.
    """
    host = []
    i = 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.find("]", i)
            if end < 0:
                raise ValueError(f"unbalanced '[' in SLURM node list {nodelist!r}")
            host.append(nodelist[i + 1:end].split(",")[0].split("-")[0])
            i = end + 1
        else:
            host.append(nodelist[i])
            i += 1
    if not host:
        raise ValueError(f"empty SLURM node list {nodelist!r}")
    return "".join(host)


def _slurm_first_host(environ: Mapping[str, str]) -> str:
    nodelist = next((environ[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                          "SLURM_NODELIST") if environ.get(k)), None)
    if nodelist is None:
        raise ValueError("SLURM task without a node list (SLURM_STEP_NODELIST / "
                         f"SLURM_JOB_NODELIST); set {ENV_COORDINATOR}")
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol:
        try:
            out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError) as e:
            logging.warning("scontrol show hostnames failed (%s); parsing %r here", e, nodelist)
    return first_hostname(nodelist)


def _slurm_plan(environ: Mapping[str, str]) -> DistributedPlan:
    num_processes = _int_var(environ, "SLURM_NTASKS")
    process_id = _int_var(environ, "SLURM_PROCID")
    _check_rank(process_id, num_processes, "SLURM_PROCID/SLURM_NTASKS")
    if num_processes == 1:
        return DistributedPlan("single", "SLURM job step with one task")
    if environ.get(ENV_COORDINATOR):
        address = _check_address(environ[ENV_COORDINATOR], ENV_COORDINATOR)
    else:
        port = (environ.get(ENV_COORDINATOR_PORT) or environ.get("JAX_COORDINATOR_PORT")
                or str(61440 + _int_var(environ, "SLURM_JOB_ID") % 4096))
        address = f"{_slurm_first_host(environ)}:{port}"
    num_nodes = next((int(environ[k]) for k in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
                                                 "SLURM_NNODES") if environ.get(k)), None)
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    local_ids = None
    if environ.get(ENV_LOCAL_DEVICE_IDS):
        local_ids = _device_ids(environ[ENV_LOCAL_DEVICE_IDS])
    elif (num_nodes is not None and num_processes > num_nodes and "SLURM_LOCALID" in environ
          and len(visible) != 1):
        # Several tasks per node that all see the node's GPUs: task k takes GPU k.
        local_ids = (_int_var(environ, "SLURM_LOCALID"),)
    return DistributedPlan("slurm", f"SLURM job {environ['SLURM_JOB_ID']}", address,
                           num_processes, process_id, local_ids)


def _on_cloud_tpu_vm() -> bool:
    """True on a Cloud TPU VM (jax sets this flag at import when it finds TPU chips)."""
    try:
        from jax._src import cloud_tpu_init
    except ImportError:
        return False
    return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def plan_distributed(environ: Mapping[str, str] | None = None, *,
                     on_tpu_vm: bool | None = None) -> DistributedPlan:
    """Decides from ``environ`` (default ``os.environ``) how this process joins the run.

    ``on_tpu_vm`` overrides the Cloud TPU VM detection (for tests). Raises ValueError on
    inconsistent settings (a partial set of TRIP_* variables, a bad number or address).
    """
    environ = os.environ if environ is None else environ
    mode = environ.get(ENV_MODE, "auto").strip().lower()
    if mode in _OFF_VALUES:
        return DistributedPlan("single", f"{ENV_MODE}={environ[ENV_MODE]}")
    if mode not in ("auto", ""):
        raise ValueError(f"{ENV_MODE} must be 'auto' or 'off', got {environ[ENV_MODE]!r}")

    explicit = [k for k in _EXPLICIT_VARS if environ.get(k)]
    if len(explicit) == len(_EXPLICIT_VARS):
        num_processes = _int_var(environ, ENV_NUM_PROCESSES)
        process_id = _int_var(environ, ENV_PROCESS_ID)
        _check_rank(process_id, num_processes, f"{ENV_PROCESS_ID}/{ENV_NUM_PROCESSES}")
        if num_processes == 1:
            return DistributedPlan("single", f"{ENV_NUM_PROCESSES}=1")
        local_ids = (_device_ids(environ[ENV_LOCAL_DEVICE_IDS])
                     if environ.get(ENV_LOCAL_DEVICE_IDS) else None)
        return DistributedPlan(
            "explicit", "TRIP_* environment variables",
            _check_address(environ[ENV_COORDINATOR], ENV_COORDINATOR),
            num_processes, process_id, local_ids)

    in_slurm_task = all(environ.get(k) for k in _SLURM_TASK_VARS)
    # Under SLURM the coordinator address alone may be given; elsewhere all three are needed.
    if explicit and not (in_slurm_task and explicit == [ENV_COORDINATOR]):
        missing = [k for k in _EXPLICIT_VARS if k not in explicit]
        raise ValueError(f"set all of {', '.join(_EXPLICIT_VARS)} or none; "
                         f"missing {', '.join(missing)}")
    if in_slurm_task:
        return _slurm_plan(environ)
    if _on_cloud_tpu_vm() if on_tpu_vm is None else on_tpu_vm:
        return DistributedPlan("tpu", "Cloud TPU VM")
    return DistributedPlan("single", "no cluster environment found")


def _cpu_collectives_to_gloo(environ: Mapping[str, str]) -> None:
    # Without a cross-process CPU collectives implementation, CPU devices of several processes
    # cannot run collectives; an explicit choice in the environment wins.
    if environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize_distributed(environ: Mapping[str, str] | None = None, *,
                           initialization_timeout: int = 300,
                           initialize_fn: Callable[..., None] | None = None) -> DistributedPlan:
    """Joins the multi-process run this process belongs to, if any; returns and logs the plan.

    Call it first, before any other JAX computation. ``environ`` defaults to ``os.environ``;
    ``initialization_timeout`` (seconds) bounds the wait for the other processes when the
    arguments are explicit; ``initialize_fn`` replaces ``jax.distributed.initialize`` (tests).
    """
    environ = os.environ if environ is None else environ
    if jax.distributed.is_initialized():
        plan = DistributedPlan("already", "jax.distributed was already initialised")
        logging.info("distributed: %s", plan.describe())
        return plan
    plan = plan_distributed(environ)
    logging.info("distributed: %s", plan.describe())
    if not plan.multi_process:
        return plan
    _cpu_collectives_to_gloo(environ)
    kwargs = plan.initialize_kwargs()
    if kwargs:
        kwargs["initialization_timeout"] = initialization_timeout
    (initialize_fn or jax.distributed.initialize)(**kwargs)
    logging.info("distributed: jax.distributed initialised (%s)", plan.method)
    return plan
