"""The shared-prefill fast path is contained: a press it does not know runs its own prefill, never a derived cache.

The fast path (:mod:`ripplekv_eval.fastpath`) derives a configuration's cache from the sample's one recorded prefill
for the presses whose classes its tables were read from (:func:`~ripplekv_eval.fastpath.hidden_tail.knows`). A new
scorer that subclasses one of kvpress's inherits its class but not what the tables say of it (here it reads every
prompt position's hidden states, where SnapKV reads its window and KNorm none), so an evaluation must run it by its
own prefill, with the fidelity of running it directly, and its record must not grow for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from kvpress import KnormPress, SnapKVPress
from kvpress.presses.base_press import BasePress

from ripplekv.inference.generate import extend, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses import FullPress, make_press
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import knows
from ripplekv_eval.running import rows as rows_module
from ripplekv_eval.running.config import EvalConfig, EvalSample
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.sample import configuration_name
from tests.conftest import random_ids, tiny_model
from tests.test_device import _Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
BUDGET = 0.3


def _with_hidden(scores: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """``scores`` plus each position's first hidden-state channel (every prompt position's hidden states are read)."""
    return scores + hidden_states[..., 0].unsqueeze(1)


@dataclass
class _HiddenSnapKV(SnapKVPress):
    """SnapKV's scores plus each position's first hidden channel: a scorer the fast path has never seen."""

    def score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, *args: Any) -> torch.Tensor:
        return _with_hidden(super().score(module, hidden_states, keys, *args), hidden_states)


@dataclass
class _HiddenKnorm(KnormPress):
    """KNorm's scores (keys only) plus each position's first hidden channel."""

    def score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, *args: Any) -> torch.Tensor:
        return _with_hidden(super().score(module, hidden_states, keys, *args), hidden_states)


def _presses() -> dict[tuple[str, float], BasePress]:
    return {
        ("full", 1.0): FullPress(),
        ("snapkv", BUDGET): make_press("snapkv", budget=BUDGET, window_size=WINDOW),
        ("snapkv@new", BUDGET): make_press("snapkv", budget=BUDGET, scorer=_HiddenSnapKV(window_size=WINDOW)),
        ("pyramidkv@new", BUDGET): make_press("pyramidkv", budget=BUDGET, window_size=WINDOW, scorer=_HiddenKnorm()),
        ("cake@new", BUDGET): make_press("cake", budget=BUDGET, scorer=_HiddenSnapKV(window_size=WINDOW)),
    }


NEW = [name for name, _ in _presses() if name.endswith("@new")]


@pytest.mark.parametrize("protocol", ["question-aware", "query-agnostic"])
def test_a_press_the_fast_path_does_not_know_runs_its_own_prefill(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=3, seed=4))
    config = EvalConfig(
        suite="needle", methods=("full", "snapkv"), budgets=(BUDGET,), window_size=WINDOW, protocol=protocol
    )
    ids = tuple(int(t) for t in random_ids(100, seed=6)[0])
    sample = EvalSample(id="s", task="t", input_ids=ids, question_start=90, max_new_tokens=6, score=lambda p: 0.0)
    presses = _presses()
    assert [name for (name, _), press in presses.items() if not knows(press)] == NEW
    derived: list[BasePress] = []
    own: list[BasePress] = []

    def derive_spy(record: Any, press: BasePress) -> Any:
        derived.append(press)
        return derive(record, press)

    def prefill_spy(model: Any, ids: torch.Tensor, press: BasePress) -> Any:
        own.append(press)
        return prefill(model, ids, press)

    derive = rows_module.derived_prefill
    monkeypatch.setattr(rows_module, "derived_prefill", derive_spy)
    monkeypatch.setattr(rows_module, "prefill", prefill_spy, raising=False)
    runner = SampleRunner(config, model, _Tokenizer(), presses)
    assert runner.hidden_tail == WINDOW + 1 and not runner.prescore  # the record does not grow for the new presses
    rows = {configuration_name(r["method"], r["scorer"]): r for r in runner.run_sample(sample, list(presses))}
    assert own == [presses[name, BUDGET] for name in NEW]
    assert [name for name, row in rows.items() if not row["shared_prefill"]] == NEW
    assert all(press in (presses["full", 1.0], presses["snapkv", BUDGET]) for press in derived)

    # each new press's fidelity is that of its own prefill, scored directly
    context = torch.tensor([list(ids[:90] if protocol == "query-agnostic" else ids)])
    question = torch.tensor([list(ids[90:])])
    tokens = rows["full"]["answer_ids"]

    def logprobs(press: BasePress) -> torch.Tensor:
        state = prefill(model, context, press)
        if protocol == "query-agnostic":
            state = extend(model, state, question)
        return teacher_forced_logprobs(model, state, tokens)

    reference = logprobs(FullPress())
    for name in NEW:
        direct = fidelity(reference, logprobs(presses[name, BUDGET]), tokens).kl
        assert rows[name]["fidelity_kl"] == pytest.approx(direct, rel=1e-9, abs=1e-12), name
    # the new scorer keeps other tokens than the SnapKV it subclasses (a fast path taking it for SnapKV would be wrong)
    assert rows["snapkv@new"]["fidelity_kl"] != pytest.approx(rows["snapkv"]["fidelity_kl"], rel=1e-3)
