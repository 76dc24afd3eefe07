#!/usr/bin/env bash
# The README's first command exactly as written (its first ```bash block under "## Two commands"), in a library-only
# environment of its own and a fresh model cache, as a new user runs it: the venv's name is the only change.
#   bash .ci/readme_first_command.sh [VENV]      (default .venv-readme)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-readme}"
command=$(awk '/^## Two commands/{s=1} s&&/^```bash$/{b=1;next} b&&/^```$/{exit} b' README.md)
case "$command" in
  *"python3 -m venv .venv && . .venv/bin/activate"*"ripplekv demo"*) ;;
  *) echo "README's first command is not a venv install followed by ripplekv demo: $command" >&2; exit 1 ;;
esac
rm -rf "$VENV"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
echo "+ ${command//.venv/$VENV}"
# a library-only install must not see the test environment's packages, nor the model cache earlier runs left
env -u VIRTUAL_ENV RIPPLEKV_CACHE="$cache" PIP_DISABLE_PIP_VERSION_CHECK=1 bash -c "set -eo pipefail; ${command//.venv/$VENV}"
# the harness's commands in that install: one line naming the extra, exit status 2 (not a traceback)
set +e
message=$("$VENV/bin/ripplekv" eval --suite needle --out "$cache/eval" 2>&1)
status=$?
set -e
echo "$message"
if [ "$status" -ne 2 ] || [ "$(printf '%s\n' "$message" | wc -l)" -ne 1 ] || [[ "$message" != *"pip install 'ripplekv[eval]'" ]]; then
  echo "ripplekv eval in a library-only install: expected one line naming ripplekv[eval] and exit 2, got $status" >&2
  exit 1
fi
