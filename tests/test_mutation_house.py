"""Relations for issue 32's rewritten modules (the traced path, the presses, the allocation rules), written for the
survivors of its mutation round (docs/mutation.md), and the tuning relation the issue named.

Each test names the seeded bug it was watched failing under.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ripplekv.inference.generate import kept_tokens, prefill
from ripplekv.presses import make_press
from ripplekv_eval.analysis.tuning import TuneConfig, TuneRunner
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import greedy_agreement
from ripplekv_eval.sample import EvalSample
from tests.conftest import random_ids, synthetic_profile, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 4

# --- every tuned candidate of a per-prompt family scores its own cache ----------------------------------------------

# LAVa's grid beside lava-layer's (same layer rule: without a head-wise split LAVa's cache would be lava-layer's),
# and grids of the other per-prompt rules (candidates whose budgets coincide may share a cache, the others may not)
FAMILY_GRIDS = (
    "lava-layer:kernel_size=3",
    "lava:floor_alpha=0|0.5|1",
    "cake:tau1=0.5|2",
    "squeezeattention:p=0.2|0.625",
    "dynamickv:radio_max=5",
)


def test_every_tuned_candidate_of_a_per_prompt_family_scores_its_own_cache() -> None:
    """Seeded: ``TuneRunner._rival_key`` keyed ``LavaPress`` like its base ``PerPromptBudgetPress`` (``isinstance``
    for ``type(press) is``: LAVa's candidates scored lava-layer's cache), and rivals grouped by method name (every
    candidate scored its family's first cache); both failed here."""
    model = tiny_model("llama", layers=4, seed=1)
    evaluation = EvalConfig(
        suite="jsonl", budgets=(0.3,), window_size=WINDOW, max_new_tokens=4, score="fidelity", options={"data": "-"}
    )
    config = TuneConfig(evaluation, {"p": "p.json"}, ratios=(4.0,), gammas=(3.0,), grids=FAMILY_GRIDS)
    runner = TuneRunner(config, {"p": synthetic_profile(model)}, model, None)
    ids = tuple(int(i) for i in random_ids(48, seed=3)[0])
    (row,) = runner.run_sample(EvalSample("t/0", "t", ids, len(ids), 4, score=lambda _: 0.0), [0.3])
    tokens = row["answer_ids"]
    prompt = torch.tensor([ids])
    reference = teacher_forced_logprobs(model, prefill(model, prompt, make_press("full")), tokens)
    direct: dict[str, Any] = {}
    for spec in config.method_candidates:  # each candidate's own press, prefilled directly (no record, no sharing)
        press = make_press(spec, budget=0.3, window_size=WINDOW)
        press.post_init_from_model(model)
        state = prefill(model, prompt, press)
        logprobs = teacher_forced_logprobs(model, state, tokens)
        direct[spec.canonical()] = (fidelity(reference, logprobs, tokens).kl, greedy_agreement(logprobs, tokens, set()))
        assert row["kept_tokens"][spec.canonical()] == kept_tokens(state), spec.canonical()
    for key, (kl, top1) in direct.items():
        assert row["kl"][key] == pytest.approx(kl, rel=1e-5, abs=1e-9), key
        assert row["top1"][key] == top1, key
    # the relation can fail: LAVa's split makes caches unlike lava-layer's, and unlike each other's
    lava = {key: kl for key, (kl, _) in direct.items() if key.startswith("lava:") or key == "lava"}
    assert any(kl != pytest.approx(direct["lava-layer"][0], rel=1e-3) for kl in lava.values())
    assert len({round(kl, 6) for kl in lava.values()}) > 1
    assert len({round(kl, 6) for kl, _ in direct.values()}) > 3
