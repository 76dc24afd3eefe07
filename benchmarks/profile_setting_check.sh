#!/usr/bin/env bash
# Issue 44: a model's profile regenerated with its RippleKV setting (r, gamma chosen by `ripplekv profile` on the
# profile's own calibration prompts), then judged on data it never saw: held-out BAMBOO MeetingQA + PaperQA 4K
# (benchmarks/heldout/bamboo.jsonl, all 169 records, untouched by any profile, calibration or tuning run),
# question-aware, 64-token answers at most, fidelity to the full cache, SnapKV's scorer, 10/20/30%.
# Candidates: the profile's setting (`ripplekv`, which runs it), the library default (`ripplekv:r=4,gamma=3`, given
# explicitly: it wins over the profile's), the setting(s) `ripplekv tune` chose for the model, every distinct
# allocation of the selection's grid (14: a gamma of at least r clips nothing), SnapKV and PyramidKV;
# every configuration of a prompt is derived from its one prefill. Then the paired checks (benchmarks/default_check.py:
# the stratified sign-flip test, Holm over a budget's comparisons, W/T/L, median and p90 of the per-prompt difference)
# of the profile's setting against every other configuration, and of each tune setting likewise.
#
#   bash benchmarks/profile_setting_check.sh MODEL OUT COMMITTED_PROFILE TUNE_JSON [TUNE_JSON ...] [-- EVAL_ARGS]
#
# Every step resumes or is skipped when done: re-running the same command continues where it stopped. With
# REUSE=<committed held-out folder>, a chosen setting that folder already ran is checked there instead (step 3a).
set -eo pipefail
cd "$(dirname "$0")/.."
MODEL=$1 OUT=$2 COMMITTED=$3
shift 3
TUNES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do TUNES+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
mkdir -p "$OUT"
PROFILE=$OUT/$MODEL.profile.json

# 1. The profile and its setting (the sensitivity pass resumes from its checkpoint; the selection follows it)
if [ ! -f "$PROFILE" ]; then
  ripplekv profile --model "$MODEL" --out "$PROFILE" 2>&1 | tee "$OUT/profile.log"
fi

# 2. The regenerated sensitivity scores against the committed profile's (same calibration, noise and seed)
python - "$PROFILE" "$COMMITTED" <<'PY' | tee "$OUT/scores_vs_committed.txt"
import json, sys
new, old = (json.load(open(path)) for path in sys.argv[1:3])
same = new["calibration"]["sha256"] == old["calibration"]["sha256"]
diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(new["scores"], old["scores"]))
rank = lambda xs: sorted(range(len(xs)), key=xs.__getitem__)
print(f"calibration set {'the same' if same else 'DIFFERENT'}; largest relative difference of a layer's score "
      f"{diff:.3g}; the same ranking of layers: {rank(new['scores']) == rank(old['scores'])}")
setting = new["setting"]
chosen = next(c for c in setting["candidates"] if (c["ratio"], c["gamma"]) == (setting["ratio"], setting["gamma"]))
default = next(c for c in setting["candidates"] if (c["ratio"], c["gamma"]) == (4.0, 3.0))
print(f"setting: r {setting['ratio']:g}, gamma {setting['gamma']:g}; calibration KL per budget "
      f"{[round(v, 4) for v in chosen['kl']]} against the default's {[round(v, 4) for v in default['kl']]}")
PY

# 3. The held-out run
SETTING=$(python -c "import json,sys; s=json.load(open(sys.argv[1]))['setting']; print(f\"ripplekv:r={s['ratio']:g},gamma={s['gamma']:g}\")" "$PROFILE")
CANONICAL=$(python -c "import sys; from ripplekv.presses.method_spec import parse_method; print(parse_method(sys.argv[1]).canonical())" "$SETTING")
# 3a. A committed held-out run (REUSE=<its folder>) that already ran the chosen setting, under a profile whose scores
# are the regenerated one's (so every allocation, hence every row, is the same), is checked instead of run again.
if [ -n "${REUSE:-}" ]; then
  python - "$PROFILE" "$COMMITTED" "$REUSE/config.json" "$CANONICAL" <<'PY'
import json, sys
new, old, config = (json.load(open(path)) for path in sys.argv[1:4])
methods = config["config"]["methods"]
if new["scores"] != old["scores"] or sys.argv[4] not in methods:
    sys.exit(f"cannot reuse: same scores {new['scores'] == old['scores']}, {sys.argv[4]} in {methods}")
PY
  mkdir -p "$OUT/heldout-reused"
  echo "held-out rows reused from $REUSE (the committed profile's scores, $CANONICAL among its methods)" \
    | tee "$OUT/heldout-reused/SOURCE.txt"
  python benchmarks/default_check.py "$REUSE" --candidate "$CANONICAL" \
    --json "$OUT/heldout-reused/check_profile_setting.json" --md "$OUT/heldout-reused/check_profile_setting.md"
  exit 0
fi
METHODS=full,snapkv,pyramidkv,ripplekv
[ "$CANONICAL" = "ripplekv:r=4,gamma=3" ] || METHODS="$METHODS,ripplekv:r=4,gamma=3"  # the profile may keep it
TUNED=()
for TUNE in "${TUNES[@]}"; do
  T=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['settings']['ripplekv'])" "$TUNE")
  [ "$T" = ripplekv ] && T="ripplekv:r=4,gamma=3"  # a tune run names the default by the plain method
  T=$(python -c "import sys; from ripplekv.presses.method_spec import parse_method; print(parse_method(sys.argv[1]).canonical())" "$T")
  case ",$METHODS," in *",$T,"*) ;; *) [ "$T" = "$CANONICAL" ] || { METHODS="$METHODS,$T"; TUNED+=("$T"); } ;; esac
done
# Every distinct allocation of the selection's grid too (a gamma of at least r clips nothing: one per r), so that any
# rule choosing among the candidates, not only the one the profile applied, is judged on these held-out prompts.
METHODS=$(python - "$PROFILE" "$METHODS" <<'PY'
import json, sys
from ripplekv.presses.method_spec import parse_method
methods: list[str] = []
for token in sys.argv[2].split(","):  # a knob ("gamma=3") belongs to the method before it
    if methods and ":" not in token and "=" in token:
        methods[-1] += "," + token
    else:
        methods.append(token)
setting = json.load(open(sys.argv[1]))["setting"]
seen = set()
for c in sorted(setting["candidates"], key=lambda c: (c["ratio"], c["gamma"])):
    key = (c["ratio"], c["gamma"] if c["gamma"] < c["ratio"] else None)
    name = parse_method(f"ripplekv:r={c['ratio']:g},gamma={c['gamma']:g}").canonical()
    if key not in seen and name not in methods:
        methods.append(name)
    seen.add(key)
print(",".join(methods))
PY
)
echo "profile's setting $CANONICAL (runs as ripplekv); methods $METHODS" | tee -a "$OUT/heldout.log"
ripplekv eval --model "$MODEL" --suite jsonl --data benchmarks/heldout/bamboo.jsonl \
  --methods "$METHODS" --budgets 0.1,0.2,0.3 --scorers snapkv --score fidelity \
  --max-new-tokens 64 --profile "$PROFILE" --no-progress --decode-memory 4GiB \
  --out "$OUT/heldout-bamboo" "$@" 2>&1 | tee -a "$OUT/heldout.log"

# 4. The paired checks: the profile's setting against every other configuration, then each tune setting
python benchmarks/default_check.py "$OUT/heldout-bamboo" --candidate ripplekv \
  --json "$OUT/heldout-bamboo/check_profile_setting.json" --md "$OUT/heldout-bamboo/check_profile_setting.md"
for T in "${TUNED[@]}"; do
  NAME=$(echo "$T" | tr ':,=' '___')
  python benchmarks/default_check.py "$OUT/heldout-bamboo" --candidate "$T" \
    --json "$OUT/heldout-bamboo/check_$NAME.json" --md "$OUT/heldout-bamboo/check_$NAME.md"
done
