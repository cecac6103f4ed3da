#!/usr/bin/env bash
# Single-host multi-GPU training: one process drives every visible GPU (no jax.distributed).
#   launch/multi_gpu.sh [--dry-run] [--gpus 0,1,2,3] CONFIG WORKDIR [trip_jax.main flags...]
#   e.g. launch/multi_gpu.sh --gpus 0,1 configs/roberta.py workdirs/rb --config.train.batch_size=8
# --dry-run prints the command instead of running it. --gpus sets CUDA_VISIBLE_DEVICES (default:
# all GPUs). Sets TRIP_DISTRIBUTED=off (one process, even inside a SLURM allocation) and adds
# --xla_gpu_enable_latency_hiding_scheduler=true to XLA_FLAGS (overlaps collectives with compute).
# Passed through from the environment: PYTHON (default python3), XLA_PYTHON_CLIENT_MEM_FRACTION.
set -euo pipefail

usage() { sed -n '2,8p' "$0" | cut -c3- >&2; exit 2; }

dry_run=0
gpus="${CUDA_VISIBLE_DEVICES:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --gpus) [[ $# -ge 2 ]] || usage; gpus="$2"; shift 2 ;;
    --gpus=*) gpus="${1#--gpus=}"; shift ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || usage
config="$1"
workdir="$2"
shift 2

env_vars=(
  "TRIP_DISTRIBUTED=off"
  "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true"
)
if [[ -n "$gpus" ]]; then
  env_vars+=("CUDA_VISIBLE_DEVICES=$gpus")
fi
cmd=(env "${env_vars[@]}" "${PYTHON:-python3}" -m trip_jax.main
     "--config=$config" "--workdir=$workdir" "$@")

if (( dry_run )); then
  printf '%q' "${cmd[0]}"
  printf ' %q' "${cmd[@]:1}"
  printf '\n'
else
  exec "${cmd[@]}"
fi
