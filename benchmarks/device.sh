#!/usr/bin/env bash
# The GPU benchmark as one prepared run: a RoBERTa-large-sized random encoder in bfloat16,
# packed batches of 8/32/64 pairs (64 with remat, 32 with and without) and the reference's
# dense layout (one pair a batch), the paper's command (configs/roberta.py, exact mode) on its
# largest batches of 8 and 32 pairs, the train and eval steps, MFU against the measured
# bf16/f32 matmul peaks, and the epoch curve (1x/2x/4x the dev pairs) at 32 pairs a batch.
# Batch sizes and remat follow the memory measured on CPU at the real size (benchmarks/
# README.md, "The paper configs at their real size": ~2.3 MB per token in bfloat16; the
# exact-mode paper config ~41 GiB at batch 8 and ~120 GiB at 32).
#
#   benchmarks/device.sh [OUT_DIR] [extra benchmarks.run flags]   (from anywhere)
#
# OUT_DIR defaults to benchmarks/results. Sized for about 10-13 minutes on one H200 (compiling
# the 24-layer train steps dominates; an estimate: no GPU was lent when it was written). To fit
# a shorter slot: --batch-sizes 1,32 --skip-curves. Each case runs in its own
# process with a time limit, so one failing case is recorded in the JSON and the rest still run;
# `python -m benchmarks.run --device --smoke` checks the same code path in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${1:-benchmarks/results}"
shift || true
if [[ -z "${TRIP_DATA_DIR:-}" ]]; then
  for dir in ../shared/data/trip shared/data/trip; do
    if [[ -d "$dir" ]]; then export TRIP_DATA_DIR="$(cd "$dir" && pwd)"; break; fi
  done
fi
: "${TRIP_DATA_DIR:?set TRIP_DATA_DIR to the TRIP data directory}"
backend="$(python -c 'import jax; print(jax.default_backend())')"
if [[ "$backend" != "gpu" && "${ALLOW_CPU:-0}" != "1" ]]; then
  echo "jax sees no GPU (backend: $backend); install jax[cuda12] or set ALLOW_CPU=1" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
mkdir -p "$out_dir"
# A compilation cache shared by the processes: the parameter init and the curve's first
# shapes compile once. The JSON is rewritten after every case, so a cut-short run keeps them.
python -m benchmarks.run --device --timeout 300 --compile-cache "${TMPDIR:-/tmp}/trip_jax_cache" \
  --out "$out_dir/device.json" "$@"
