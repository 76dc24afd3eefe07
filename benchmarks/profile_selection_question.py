"""The setting's selection (``ripplekv profile``'s choice of r and gamma) asked question-style (issue 44 diagnosis).

The same 8 calibration essays as the profile (same contexts, so the same calibration sha256), each followed by a
question, and continued by the model's own greedy answer (``ProfilingConfig(continuation="model")``) instead of the
essay's next 32 tokens: what serving a question over a document looks like. Every candidate of the selection grid is
scored as ``ripplekv profile`` scores it (KL to the full cache over the teacher-forced continuation, 10/20/30%), and
the per-prompt evidence is written as JSON, so that selection rules can be compared with the held-out runs.

    python benchmarks/profile_selection_question.py --model smollm2-135m --profile P.json --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from ripplekv.inference.setting import SettingSelector
from ripplekv.models.loading import load_model
from ripplekv.profiling.calibration import load_calibration
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig

QUESTION = "\n\nQuestion: What is the main point of the text above?\nAnswer:"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--profile", type=Path, required=True, help="the profile whose calibration essays are asked")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    profile = SensitivityProfile.load(args.profile)
    model, tokenizer = load_model(args.model)
    calibration = load_calibration(None, tokenizer, 8, 2048, 32, 0)
    calibration = replace(calibration, samples=tuple(replace(s, question=args.question) for s in calibration.samples))
    config = ProfilingConfig(continuation="model", answer_tokens=args.answer_tokens)
    started = time.perf_counter()
    setting = SettingSelector().select(model, tokenizer, calibration, profile, config).setting
    print(f"chose r {setting.ratio:g}, gamma {setting.gamma:g} in {time.perf_counter() - started:.0f} s")
    record = {
        "question": args.question,
        "answer_tokens": args.answer_tokens,
        "ratio": setting.ratio,
        "gamma": setting.gamma,
        "rule": setting.rule,
        "budgets": list(setting.budgets),
        "candidates": [
            {"ratio": c.ratio, "gamma": c.gamma, "kl": list(c.kl), "prompt_kl": [list(r) for r in c.prompt_kl]}
            for c in setting.candidates
        ],
        "snapkv_kl": [list(r) for r in setting.snapkv_kl],
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
