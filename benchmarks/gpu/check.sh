#!/usr/bin/env bash
# benchmarks/gpu/check.sh: the prepared GPU check of RippleKV, one script, results as JSON.
#
# STATUS: NOT run on a GPU yet. Written and self-checked on the CPU only (--dry-run, tests/test_gpu_check.py);
# it runs when a session is lent a GPU machine (the device tool draws one per task, by chance).
#
# What it does, in under 8 minutes on one H200 (the budget, --budget-s, is 450 s by default):
#   1. installs the pinned wheels the machine lacks (kvpress 0.5.5, transformers 5.2.0, tokenizers 0.22.2 and
#      kvpress's import-time needs; see fetch_wheels.sh) from benchmarks/gpu/wheels or --wheels DIR, offline, with
#      `pip install --no-index --no-deps --target` into a folder put first on PYTHONPATH: the machine's own torch
#      and site-packages are not touched;
#   2. runs the test suite's gpu-marked tests (`pytest -m gpu` over the test files that have them): tiny random
#      models on cuda in bf16 and float16, every method through generate_answer, batched decoding equal to
#      sequential decoding, bf16 profiling against float32;
#   3. measures the paper's efficiency table on a RANDOM-weight Llama-3.1-8B built on the GPU from
#      configs/llama-3.1-8b.json (bf16, sdpa) at 32K and 128K tokens: full, SnapKV, PyramidKV, AdaKV and RippleKV
#      at 10/20/30%: prefill-and-compress seconds and their ratio to SnapKV's (goal: RippleKV <= 1.02), decoding ms
#      per token, peak GPU memory per configuration (torch.cuda.max_memory_allocated), held/kept cache fractions.
#      RippleKV runs on a SYNTHETIC profile (deterministic scores; time and memory depend only on the budgets it
#      sets). See efficiency_gpu.py;
#   4. writes OUT_DIR/gpu-check.json (environment: versions, GPU; the tests' summary; every row), and
#      OUT_DIR/check.log and OUT_DIR/pytest-gpu.xml. OUT_DIR is --out DIR, else $OUT (the device tool's), else
#      benchmarks/results/gpu; run outside the device tool, the JSON is also copied to benchmarks/results/gpu/.
# Where torch sees no GPU it says so, writes a JSON with skipped_reason, and exits 0.
#
# With the device tool (here: fetch the wheels once, then one call):
#   bash benchmarks/gpu/fetch_wheels.sh          # ~15 MB into benchmarks/gpu/wheels (gitignored)
#   run(command="bash benchmarks/gpu/check.sh", carry=["benchmarks/gpu/wheels"], timeout_s=540)
#   # -> files_at/gpu-check.json, check.log, pytest-gpu.xml; copy gpu-check.json to benchmarks/results/gpu/
#
# Options:
#   --dry-run        CPU self-check: the same pipeline on a 2-layer Llama (hidden 64) at 256/512 tokens, the same
#                    JSON schema, in seconds; no install and no tests unless asked (--wheels, --tests)
#   --out DIR        where the results go
#   --wheels DIR     wheel folder (default benchmarks/gpu/wheels)
#   --no-install     use the Python environment as it is
#   --tests / --no-tests   run or skip the gpu tests (default: run them where a GPU is seen, not in --dry-run)
#   --budget-s N     seconds the whole script may take (default 450; 120 with --dry-run)
#   -- ARGS          passed on to efficiency_gpu.py, e.g. `-- --lengths 8192 --repeats 1` (a one-minute smoke run)
# Environment: PYTHON (default python3), GPU_CHECK_SITE (install target, default $TMPDIR/ripplekv-gpu-site),
#   GPU_CHECK_TEST_TIMEOUT (seconds for the tests, default 150).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO" || exit 2
START=$(date +%s)
DRY=0
OUT_DIR=""
WHEELS=""
INSTALL=auto
TESTS=auto
BUDGET=""
BENCH_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR="$2"; shift ;;
    --wheels) WHEELS="$2"; shift ;;
    --no-install) INSTALL=0 ;;
    --tests) TESTS=1 ;;
    --no-tests) TESTS=0 ;;
    --budget-s) BUDGET="$2"; shift ;;
    --) shift; BENCH_EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PYTHON="${PYTHON:-python3}"
if [ -z "$BUDGET" ]; then BUDGET=$([ "$DRY" = 1 ] && echo 120 || echo 450); fi
if [ -z "$OUT_DIR" ]; then
  if [ -n "${OUT:-}" ]; then OUT_DIR="$OUT"
  elif [ "$DRY" = 1 ]; then OUT_DIR="${TMPDIR:-/tmp}/ripplekv-gpu-check-dry-run"
  else OUT_DIR="$REPO/benchmarks/results/gpu"; fi
fi
mkdir -p "$OUT_DIR" && OUT_DIR="$(cd "$OUT_DIR" && pwd)"
exec > >(tee "$OUT_DIR/check.log") 2>&1
RESULT="$OUT_DIR/gpu-check.json"
rm -f "$RESULT" "$OUT_DIR/pytest-gpu.xml"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
log() { echo "[check.sh +$(( $(date +%s) - START ))s] $*"; }
fail_json() {  # a result that says why nothing was measured (plain Python: the imports may be what failed)
  "$PYTHON" - "$RESULT" "$1" "$DRY" <<'PY'
import json, sys
json.dump({"schema": "ripplekv-gpu-check/1", "dry_run": sys.argv[3] == "1", "complete": False,
           "error": sys.argv[2], "rows": []}, open(sys.argv[1], "w"), indent=2)
PY
}
log "repo $REPO; results in $OUT_DIR; budget ${BUDGET}s; $([ "$DRY" = 1 ] && echo 'DRY RUN (CPU, tiny model)')"

# 1. wheels (offline), into a folder of their own ahead of the machine's site-packages
EXPLICIT_WHEELS=1
if [ -z "$WHEELS" ]; then WHEELS="$REPO/benchmarks/gpu/wheels"; EXPLICIT_WHEELS=0; fi
if [ "$INSTALL" = auto ]; then INSTALL=$([ "$DRY" = 0 ] || [ "$EXPLICIT_WHEELS" = 1 ] && echo 1 || echo 0); fi
EXTRA_PATH=""
if [ "$INSTALL" = 1 ]; then
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE="${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/ripplekv-gpu-site}"
    rm -rf "$SITE"
    log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE (torch untouched)"
    if ! "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --upgrade --target "$SITE" "$WHEELS"/*.whl; then
      log "FAILED to install the wheels"; fail_json "pip install of $WHEELS failed (see check.log)"; exit 1
    fi
    EXTRA_PATH="$SITE:"
  else
    log "WARNING: no wheels in $WHEELS (run benchmarks/gpu/fetch_wheels.sh here and carry benchmarks/gpu/wheels);"
    log "         using the installed packages as they are"
  fi
fi
export PYTHONPATH="${EXTRA_PATH}$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"

# 2. what this Python has: versions, and whether torch sees a GPU (a dry run without an install only reads the
#    versions: the run itself imports everything a few seconds later)
if ! CUDA=$("$PYTHON" - "$([ "$DRY" = 1 ] && [ "$INSTALL" = 0 ] && echo light)" <<'PY'
import importlib.metadata as md, importlib.util, sys
import torch
if sys.argv[1:] != ["light"]:
    import kvpress, transformers, ripplekv  # noqa: F401  (fail here, with a clear message, not in the middle)
where = importlib.util.find_spec("ripplekv").origin.rsplit("/", 2)[0]
v = md.version("transformers")
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}), transformers {v},"
      f" kvpress {md.version('kvpress')}, tokenizers {md.version('tokenizers')}, ripplekv from {where}",
      file=sys.stderr)
if md.version("kvpress") != "0.5.5" or not v.startswith("5.2"):
    print(f"WARNING: expected kvpress 0.5.5 and transformers 5.2.x (the tested pins)", file=sys.stderr)
ok = torch.cuda.is_available()
if ok:
    print(f"GPU: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB",
          file=sys.stderr)
print(int(ok))
PY
); then
  log "FAILED: the packages do not import (see above)"; fail_json "imports failed (see check.log)"; exit 1
fi
if [ "$DRY" = 0 ] && [ "$CUDA" != 1 ]; then
  log "SKIP: torch sees no CUDA GPU here; nothing to measure (the CPU self-check is --dry-run)"
fi

# 3. the gpu-marked tests
if [ "$TESTS" = auto ]; then TESTS=$([ "$DRY" = 0 ] && [ "$CUDA" = 1 ] && echo 1 || echo 0); fi
PYTEST_ARGS=(--pytest-skipped "not run: $([ "$DRY" = 1 ] && echo 'dry run' || echo 'no GPU or --no-tests')")
FILES=()
[ "$TESTS" = 1 ] && mapfile -t FILES < <(grep -l "pytest.mark.gpu" tests/test_*.py)
if [ "$TESTS" = 1 ] && [ "${#FILES[@]}" = 0 ]; then
  log "no test file has gpu-marked tests: none run"
  TESTS=0
  PYTEST_ARGS=(--pytest-skipped "not run: no gpu-marked tests found")
fi
if [ "$TESTS" = 1 ]; then
  log "pytest -m gpu ${FILES[*]}"
  timeout --kill-after=10 "${GPU_CHECK_TEST_TIMEOUT:-150}" "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/pytest-gpu.xml" "${FILES[@]}"
  TEST_RC=$?
  log "tests: exit status $TEST_RC$([ "$TEST_RC" = 124 ] && echo ' (TIMED OUT)')"
  PYTEST_ARGS=(--pytest-junit "$OUT_DIR/pytest-gpu.xml" --pytest-rc "$TEST_RC")
else
  TEST_RC=0
fi

# 4. the efficiency table (it plans its lengths to fit the time left, and rewrites the JSON after each one)
LEFT=$(( BUDGET - ($(date +%s) - START) ))
DEADLINE=$(( LEFT - 20 ))
if [ "$DEADLINE" -lt 10 ]; then DEADLINE=10; LEFT=30; fi
log "efficiency: ${DEADLINE}s to plan with"
BENCH_ARGS=(--out "$OUT_DIR" --deadline-s "$DEADLINE" "${PYTEST_ARGS[@]}" "${BENCH_EXTRA[@]}")
[ "$DRY" = 1 ] && BENCH_ARGS+=(--dry-run)
timeout --kill-after=10 "$LEFT" "$PYTHON" -m benchmarks.gpu.efficiency_gpu "${BENCH_ARGS[@]}"
BENCH_RC=$?
log "efficiency: exit status $BENCH_RC$([ "$BENCH_RC" = 124 ] && echo ' (TIMED OUT: the JSON holds the lengths done)')"
[ -f "$RESULT" ] || fail_json "the efficiency run wrote no result (exit status $BENCH_RC; see check.log)"

if [ -z "${OUT:-}" ] && [ "$DRY" = 0 ] && [ "$CUDA" = 1 ] && [ "$OUT_DIR" != "$REPO/benchmarks/results/gpu" ]; then
  mkdir -p "$REPO/benchmarks/results/gpu" && cp "$RESULT" "$REPO/benchmarks/results/gpu/" \
    && log "copied gpu-check.json to benchmarks/results/gpu/"
fi
log "done: $RESULT (tests: $TEST_RC, efficiency: $BENCH_RC)"
[ "$BENCH_RC" = 0 ] && [ "$TEST_RC" = 0 ]
