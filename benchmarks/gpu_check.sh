#!/usr/bin/env bash
# The GPU check as one device command (benchmarks/README.md, "The GPU check"): installs what
# the stock image lacks from benchmarks/device_carry/ (filled here by device_setup.sh, carried
# with the call) into a temporary site, then runs benchmarks.gpu_check, whose JSON (rewritten
# after every case) goes to OUT_DIR/h200.json.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [benchmarks.gpu_check flags]
#
# A hard stop at the budget plus 30 s keeps the command within one lease's 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${1:?usage: gpu_check.sh OUT_DIR [flags]}"
shift
carry=benchmarks/device_carry
[[ -d "$carry/wheels" ]] || { echo "no $carry: run benchmarks/device_setup.sh first" >&2; exit 1; }
site="$(mktemp -d)"
wheels=("$carry"/wheels/*.whl)
if ! python -c "import pytest" 2>/dev/null; then wheels+=("$carry"/test_wheels/*.whl); fi
python -m pip install --quiet --no-index --no-deps --target "$site" "${wheels[@]}"
export PYTHONPATH="$PWD:$site:$PWD/$carry/python${PYTHONPATH:+:$PYTHONPATH}"
export TRIP_DATA_DIR="${TRIP_DATA_DIR:-$PWD/$carry/data/trip}"
# JAX takes device memory as it needs it (the PyTorch reference runs first, in the same
# process, and hands its memory back) and may grow to this share of the device.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
mkdir -p "$out_dir"
timeout --signal=TERM 470 python -m benchmarks.gpu_check --out "$out_dir/h200.json" "$@"
