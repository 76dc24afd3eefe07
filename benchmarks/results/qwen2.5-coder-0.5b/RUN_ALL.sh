#!/usr/bin/env bash
# Every step of issue 33's runs on Qwen2.5-Coder-0.5B, in order; each step resumes where it stopped, so this file
# is rerun as it is after an interruption (a step already complete costs only its model load and check).
#   1. COMMAND.sh: the profile and the per-layer damage analysis (180 rows, ~2 min each here)
#   2. tune/COMMAND.sh: every family's knobs and RippleKV's r/gamma on 48 calibration prompts
#   3. longbench-default/COMMAND.sh, longbench-tuned/COMMAND.sh: the 124-prompt matrices (~2-3 h of CPU each with one decoding batch per prompt)
#   4. heldout-bamboo/COMMAND.sh: the held-out check of the default (169 BAMBOO prompts)
#   5. oracle-fidelity/COMMAND.sh: the oracle ceiling (80 prompts); last, as no other step reads it
set -eo pipefail
D="$(cd "$(dirname "$0")" && pwd)"
bash "$D/COMMAND.sh"
bash "$D/tune/COMMAND.sh"
bash "$D/longbench-default/COMMAND.sh"
bash "$D/longbench-tuned/COMMAND.sh"
bash "$D/heldout-bamboo/COMMAND.sh"
bash "$D/oracle-fidelity/COMMAND.sh"
