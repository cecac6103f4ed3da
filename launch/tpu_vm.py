#!/usr/bin/env python3
"""Trains trip-jax on a Cloud TPU VM or pod slice through gcloud.

    python launch/tpu_vm.py create --name trip --zone us-central2-b --accelerator-type v4-32 --spot
    python launch/tpu_vm.py setup  --name trip --zone us-central2-b
    python launch/tpu_vm.py run    --name trip --zone us-central2-b \\
        --config configs/roberta.py --workdir gs://BUCKET/trip/roberta \\
        -- --config.train.batch_size=64
    python launch/tpu_vm.py run    ... --compile-first v4-32 -- ...   # XLA:TPU compile here first
    python launch/tpu_vm.py logs   --name trip --zone us-central2-b
    python launch/tpu_vm.py delete --name trip --zone us-central2-b

Every subcommand takes --dry-run, which prints the exact commands instead of running them.
setup packs this checkout (no .git), copies it to every worker (tpu-vm scp --worker=all) and
installs it there (`pip install jax[tpu]` and `pip install -e .`). run starts
`python3 -m trip_jax.main` with nohup on every worker at once (--worker=all), logging to a file in
the remote home; the workers find each other through jax's TPU detection
(trip_jax.runtime.distributed). The workdir must be a gs:// path: checkpoints of a pod slice are written
by all hosts to one place. Remote paths are relative to the remote home directory. run
--compile-first TYPE first compiles the config's steps for TYPE on this machine (trip_jax.main
--mode=compile, docs/compile.md; needs `pip install -e .[tpu]` here) and starts nothing if they
do not fit.
Needs only the Python standard library and gcloud (authenticated, with a default project or
--project).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from cli import split_overrides  # launch/cli.py: this script's folder is on sys.path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNTIME = "tpu-ubuntu2204-base"  # v4; v5e: v2-alpha-tpuv5-lite, v5p: v2-alpha-tpuv5
# Never shipped to the workers: history, caches, local run outputs.
TAR_EXCLUDES = (".git", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis",
                "workdirs", ".whl", ".gl")


def _gcloud(verb: str, args, name_args) -> list[str]:
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", verb, *name_args, f"--zone={args.zone}"]
    if args.project:
        cmd.append(f"--project={args.project}")
    return cmd


def _tarball(name: str) -> str:
    return str(Path(tempfile.gettempdir()) / f"trip-jax-{name}.tar.gz")


def create_commands(args) -> list[list[str]]:
    """gcloud command that creates the TPU VM (or pod slice)."""
    cmd = _gcloud("create", args, [args.name])
    cmd += [f"--accelerator-type={args.accelerator_type}", f"--version={args.version}"]
    if args.spot:
        cmd.append("--spot")
    if args.preemptible:
        cmd.append("--preemptible")
    return [cmd]


def setup_commands(args) -> list[list[str]]:
    """Pack the checkout, copy it to every worker, unpack and install it there."""
    tarball = _tarball(args.name)
    remote_tar = f"{args.remote_dir}.tar.gz"
    pack = ["tar", "-czf", tarball, *(f"--exclude={p}" for p in TAR_EXCLUDES),
            "-C", str(Path(args.source).resolve()), "."]
    copy = _gcloud("scp", args, [tarball, f"{args.name}:{remote_tar}"]) + ["--worker=all"]
    pip = ["python3", "-m", "pip", "install", "-U"]
    install = " && ".join([
        shlex.join(["mkdir", "-p", args.remote_dir]),
        shlex.join(["tar", "-xzf", remote_tar, "-C", args.remote_dir]),
        shlex.join(["cd", args.remote_dir]),
        shlex.join([*pip, args.jax_spec]),
        shlex.join([*pip[:-1], "-e", ".", *args.extra_pip]),
    ])
    remote = _gcloud("ssh", args, [args.name]) + ["--worker=all", f"--command={install}"]
    return [pack, copy, remote]


def train_command(args, overrides: list[str]) -> list[str]:
    """The trip_jax.main command line each worker runs."""
    return ["python3", "-m", "trip_jax.main", f"--config={args.config}",
            f"--workdir={args.workdir}", *overrides]


def compile_command(args, overrides: list[str]) -> list[str]:
    """The local compile of ``--compile-first``: the config's steps for that accelerator type,
    its report in a local workdir."""
    workdir = Path(tempfile.gettempdir()) / f"trip-jax-compile-{args.name}"
    return [sys.executable, "-m", "trip_jax.main", f"--config={args.config}",
            f"--workdir={workdir}", "--mode=compile", f"--topology={args.compile_first}",
            *overrides]


def run_commands(args, overrides: list[str]) -> list[list[str]]:
    """Start training on all workers at once, detached (nohup), logging to a file; with
    ``--compile-first`` the local compile comes first."""
    if not args.workdir.startswith("gs://"):
        raise SystemExit(f"--workdir must be a gs:// path that every worker can write, "
                         f"got {args.workdir!r}")
    train = shlex.join(train_command(args, overrides))
    remote = (f"cd {shlex.quote(args.remote_dir)} && nohup {train}"
              f" > {shlex.quote(args.log)} 2>&1 < /dev/null &")
    first = [compile_command(args, overrides)] if args.compile_first else []
    return first + [_gcloud("ssh", args, [args.name]) + ["--worker=all", f"--command={remote}"]]


def logs_commands(args) -> list[list[str]]:
    """Show the end of one worker's training log."""
    tail = shlex.join(["tail", "-n", str(args.lines), args.log])
    return [_gcloud("ssh", args, [args.name]) + [f"--worker={args.worker}", f"--command={tail}"]]


def delete_commands(args) -> list[list[str]]:
    """Tear the TPU VM down (no prompt: asking for delete is the confirmation)."""
    return [_gcloud("delete", args, [args.name]) + ["--quiet"]]


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (one subparser per subcommand)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="TPU VM name")
    common.add_argument("--zone", required=True, help="e.g. us-central2-b")
    common.add_argument("--project", help="GCP project (default: gcloud's configured one)")
    common.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--remote-dir", default="trip-jax",
                        help="code folder on the workers, relative to the remote home")
    log = argparse.ArgumentParser(add_help=False)
    log.add_argument("--log", default="trip-jax-run.log",
                     help="training log on each worker, relative to the remote home")

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("create", parents=[common], help="create the TPU VM / pod slice")
    p.add_argument("--accelerator-type", required=True, help="e.g. v4-8, v4-32, v5litepod-16")
    p.add_argument("--version", default=DEFAULT_RUNTIME, help="TPU software (runtime) version")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--spot", action="store_true", help="Spot VM (can be reclaimed)")
    kind.add_argument("--preemptible", action="store_true", help="preemptible VM (legacy)")
    p = sub.add_parser("setup", parents=[common, remote], help="copy the code and install it")
    p.add_argument("--source", default=str(REPO_ROOT), help="checkout to copy")
    p.add_argument("--jax-spec", default="jax[tpu]", help="pip requirement for jax")
    p.add_argument("--extra-pip", nargs="*", default=[], help="more pip requirements")
    p = sub.add_parser("run", parents=[common, remote, log],
                       help="start trip_jax.main on all workers; pass overrides after --")
    p.add_argument("--config", required=True, help="config file, relative to the code folder")
    p.add_argument("--workdir", required=True, help="gs://BUCKET/...")
    p.add_argument("--compile-first", metavar="TYPE",
                   help="compile the steps for this accelerator type here first (v4-32, ...)")
    p = sub.add_parser("logs", parents=[common, log], help="tail one worker's training log")
    p.add_argument("--worker", default="0")
    p.add_argument("--lines", type=int, default=100)
    sub.add_parser("delete", parents=[common], help="delete the TPU VM")
    return parser


def main(argv: list[str]) -> None:
    """Builds the commands of one subcommand and prints (--dry-run) or runs them in order."""
    argv, overrides = split_overrides(argv)
    args = build_parser().parse_args(argv)
    if overrides and args.command != "run":
        raise SystemExit("arguments after -- are trip_jax.main overrides; only 'run' takes them")
    if args.command == "run":
        commands = run_commands(args, overrides)
    else:
        commands = {"create": create_commands, "setup": setup_commands, "logs": logs_commands,
                    "delete": delete_commands}[args.command](args)
    for cmd in commands:
        print(shlex.join(cmd), flush=True)
        if not args.dry_run:
            # The local compile runs in this checkout; a refusal (its one line) stops here.
            local = cmd[0] == sys.executable
            done = subprocess.run(cmd, cwd=REPO_ROOT if local else None)
            if done.returncode:
                if local:
                    raise SystemExit(done.returncode)
                raise subprocess.CalledProcessError(done.returncode, cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
