#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels the GPU machine lacks into benchmarks/gpu/wheels/
# (gitignored; the device tool carries it: run(..., carry=["benchmarks/gpu/wheels"])). check.sh installs them
# there with `pip install --no-index --no-deps --target` so the machine's own torch (and everything else it has)
# is left untouched.
#
# The GPU machine (see /work/.library/device/KINDS.md) runs Python 3.12 with torch 2.11 and transformers 5.17,
# too new for kvpress 0.5.5 (transformers < 5.3), and has no kvpress, datasets, fire or cachetools. Pinned here:
#   kvpress 0.5.5, transformers 5.2.0 (the versions the project is tested with), tokenizers 0.22.2 (transformers
#   5.2.0 checks tokenizers <= 0.23.0 at import; the machine has 0.23.2), and kvpress's import-time needs that
#   the machine lacks: datasets, dill, multiprocess, fire (+ termcolor), cachetools.
#
#   bash benchmarks/gpu/fetch_wheels.sh            # into benchmarks/gpu/wheels
#   bash benchmarks/gpu/fetch_wheels.sh DIR        # elsewhere
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-$HERE/wheels}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$DEST"

# name==version, one a line: the machine's Python is CPython 3.12 on x86-64 Linux
PINS=(
  kvpress==0.5.5
  transformers==5.2.0
  tokenizers==0.22.2
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
  cachetools==5.5.2
  termcolor==3.3.0
)
PLATFORM=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORM[@]}" -d "$DEST" "${PINS[@]}"

# fire 0.6.0 (kvpress needs fire < 0.7) is published as a source archive only: build its (pure-Python) wheel here
if ! ls "$DEST"/fire-0.6.0-*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip wheel -q --no-deps -w "$DEST" fire==0.6.0
fi
rm -f "$DEST"/*.tar.gz
du -sh "$DEST"
ls -1 "$DEST"
