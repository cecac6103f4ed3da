"""initialize_distributed's decisions, on made-up environments (no real jax.distributed call)."""

from __future__ import annotations

import os
import stat

import jax
import pytest

from trip_jax.runtime import distributed
from trip_jax.runtime.distributed import first_hostname, initialize_distributed, plan_distributed

SLURM_TASK = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4", "SLURM_PROCID": "2",
              "SLURM_LOCALID": "0", "SLURM_STEP_NUM_NODES": "4",
              "SLURM_STEP_NODELIST": "gpu[017-020]", "PATH": ""}


class FakeInitialize:
    """Records the calls to jax.distributed.initialize and the CPU collectives setting then."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append((kwargs, jax.config.jax_cpu_collectives_implementation))


@pytest.fixture
def fake_init(monkeypatch):
    monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: False)
    before = jax.config.jax_cpu_collectives_implementation
    jax.config.update("jax_cpu_collectives_implementation", "mpi")  # so gloo must be set
    yield FakeInitialize()
    jax.config.update("jax_cpu_collectives_implementation", before)


def test_no_cluster_is_single_process_without_a_call(fake_init, caplog):
    caplog.set_level("INFO")
    plan = initialize_distributed({"PATH": "/usr/bin"}, initialize_fn=fake_init)
    assert plan.method == "single" and not plan.multi_process
    assert fake_init.calls == []
    assert jax.config.jax_cpu_collectives_implementation == "mpi"  # untouched
    assert "not called" in caplog.text


def test_explicit_env_vars_initialise_with_gloo_first(fake_init, caplog):
    caplog.set_level("INFO")
    env = {"TRIP_COORDINATOR_ADDRESS": "10.0.0.1:1234", "TRIP_NUM_PROCESSES": "2",
           "TRIP_PROCESS_ID": "1"}
    plan = initialize_distributed(env, initialization_timeout=17, initialize_fn=fake_init)
    assert plan.method == "explicit"
    [(kwargs, collectives)] = fake_init.calls
    assert collectives == "gloo"
    assert kwargs == dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1,
                          local_device_ids=None, cluster_detection_method="deactivate",
                          initialization_timeout=17)
    assert "process 1 of 2, coordinator 10.0.0.1:1234" in caplog.text


def test_explicit_local_device_ids_and_user_collectives_choice(fake_init):
    env = {"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "3", "TRIP_PROCESS_ID": "0",
           "TRIP_LOCAL_DEVICE_IDS": "2,3", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"}
    initialize_distributed(env, initialize_fn=fake_init)
    [(kwargs, collectives)] = fake_init.calls
    assert kwargs["local_device_ids"] == [2, 3]
    assert collectives == "mpi"


def test_one_explicit_process_is_single(fake_init):
    env = {"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "1", "TRIP_PROCESS_ID": "0"}
    assert initialize_distributed(env, initialize_fn=fake_init).method == "single"
    assert fake_init.calls == []


@pytest.mark.parametrize("env, message", [
    ({"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "2"}, "missing TRIP_PROCESS_ID"),
    ({"TRIP_PROCESS_ID": "0"}, "missing TRIP_COORDINATOR_ADDRESS, TRIP_NUM_PROCESSES"),
    ({"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "2", "TRIP_PROCESS_ID": "2"},
     "process id 2 of 2"),
    ({"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "two", "TRIP_PROCESS_ID": "0"},
     "must be an integer"),
    ({"TRIP_COORDINATOR_ADDRESS": "host", "TRIP_NUM_PROCESSES": "2", "TRIP_PROCESS_ID": "0"},
     "HOST:PORT"),
    ({"TRIP_DISTRIBUTED": "maybe"}, "'auto' or 'off'"),
    ({**SLURM_TASK, "TRIP_NUM_PROCESSES": "4"}, "missing TRIP_COORDINATOR_ADDRESS"),
])
def test_inconsistent_settings_fail_before_any_call(fake_init, env, message):
    with pytest.raises(ValueError, match=message):
        initialize_distributed(env, initialize_fn=fake_init)
    assert fake_init.calls == []


def test_off_wins_over_everything(fake_init, monkeypatch):
    monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: True)
    env = {**SLURM_TASK, "TRIP_DISTRIBUTED": "off", "TRIP_COORDINATOR_ADDRESS": "h:1",
           "TRIP_NUM_PROCESSES": "2", "TRIP_PROCESS_ID": "0"}
    assert initialize_distributed(env, initialize_fn=fake_init).method == "single"
    assert fake_init.calls == []


def test_explicit_wins_over_slurm_and_tpu(fake_init, monkeypatch):
    monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: True)
    env = {**SLURM_TASK, "TRIP_COORDINATOR_ADDRESS": "h:9", "TRIP_NUM_PROCESSES": "2",
           "TRIP_PROCESS_ID": "1"}
    plan = initialize_distributed(env, initialize_fn=fake_init)
    assert (plan.method, plan.num_processes, plan.process_id) == ("explicit", 2, 1)


def test_slurm_one_task_per_node_sees_all_gpus(fake_init):
    plan = initialize_distributed(dict(SLURM_TASK), initialize_fn=fake_init)
    [(kwargs, collectives)] = fake_init.calls
    assert plan.method == "slurm" and collectives == "gloo"
    # First node of the list, jax's port rule: 61440 + 4242 % 4096.
    assert kwargs["coordinator_address"] == "gpu017:61586"
    assert (kwargs["num_processes"], kwargs["process_id"]) == (4, 2)
    assert kwargs["local_device_ids"] is None
    assert kwargs["cluster_detection_method"] == "deactivate"


def test_slurm_task_per_gpu_takes_its_local_gpu():
    env = {**SLURM_TASK, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_LOCALID": "3",
           "SLURM_STEP_NODELIST": "a1,a2", "TRIP_COORDINATOR_PORT": "5000"}
    plan = plan_distributed(env, on_tpu_vm=False)
    assert plan.local_device_ids == (3,)
    assert plan.coordinator_address == "a1:5000"
    # A task that SLURM already bound to one GPU sees only that GPU: no restriction.
    bound = plan_distributed({**env, "CUDA_VISIBLE_DEVICES": "3"}, on_tpu_vm=False)
    assert bound.local_device_ids is None


def test_slurm_coordinator_from_env_and_single_task():
    env = {**SLURM_TASK, "TRIP_COORDINATOR_ADDRESS": "head:7777"}
    assert plan_distributed(env, on_tpu_vm=False).coordinator_address == "head:7777"
    single = plan_distributed({**SLURM_TASK, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},
                              on_tpu_vm=False)
    assert single.method == "single"
    # The batch script itself (no srun: no SLURM_PROCID) is not a task.
    no_task = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_PROCID"}
    assert plan_distributed(no_task, on_tpu_vm=False).method == "single"


def test_slurm_uses_scontrol_when_available(tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n-first\\nn-2\\n"\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = {**SLURM_TASK, "PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin"}
    assert plan_distributed(env, on_tpu_vm=False).coordinator_address == "n-first:61586"


@pytest.mark.parametrize("nodelist, host", [
    ("node001", "node001"),
    ("node001,host2", "node001"),
    ("node[001-015],host2", "node001"),
    ("node[007,001-003]", "node007"),
    ("rack[2-3]-n[07-09]", "rack2-n07"),
    ("gpu-a100-[10-12].cluster", "gpu-a100-10.cluster"),
])
def test_first_hostname(nodelist, host):
    assert first_hostname(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "node[01-03", ",a"])
def test_first_hostname_rejects_bad_lists(nodelist):
    with pytest.raises(ValueError):
        first_hostname(nodelist)


def test_tpu_vm_calls_plain_initialize(fake_init, monkeypatch):
    monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: True)
    plan = initialize_distributed({}, initialize_fn=fake_init)
    assert plan.method == "tpu"
    assert fake_init.calls == [({}, "gloo")]


def test_already_initialised_is_left_alone(fake_init, monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    env = {"TRIP_COORDINATOR_ADDRESS": "h:1", "TRIP_NUM_PROCESSES": "2", "TRIP_PROCESS_ID": "0"}
    assert initialize_distributed(env, initialize_fn=fake_init).method == "already"
    assert fake_init.calls == []
