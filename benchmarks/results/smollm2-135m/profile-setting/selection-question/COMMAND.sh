#!/usr/bin/env bash
# Issue 44, diagnosis: the setting's selection on SmolLM2-135M's 8 calibration essays asked question-style (each essay
# followed by "Question: What is the main point of the text above? Answer:", continued by the model's own 32-token
# greedy answer) instead of with the essay's next 32 tokens; the profile is the regenerated one beside this folder.
# Ran once (85 minutes of wall time at nice 10-19 beside three other benchmarks on this 2-core machine) with the
# script then at /tmp, the same computation as benchmarks/profile_selection_question.py.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
python benchmarks/profile_selection_question.py --model smollm2-135m \
  --profile benchmarks/results/smollm2-135m/profile-setting/smollm2-135m.profile.json \
  --out benchmarks/results/smollm2-135m/profile-setting/selection-question/selection.json
