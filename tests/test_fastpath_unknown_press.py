"""The shared-prefill fast path is contained: a press it does not know runs its own prefill, never a derived cache.

The fast path (:mod:`ripplekv_eval.fastpath`) derives a configuration's cache from the sample's one recorded prefill
for the presses whose classes its tables were read from (:func:`~ripplekv_eval.fastpath.hidden_tail.is_derivable`).
A new scorer that subclasses one of kvpress's inherits its class but not what the tables say of it (here it reads
every prompt position's hidden states, where SnapKV reads its window and KNorm none), so an evaluation, a tuning run
and a damage analysis must run it by its own prefill, with the fidelity of running it directly, and their records
must not grow for it.
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
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.registry import make_press
from ripplekv_eval.analysis import damage as damage_module
from ripplekv_eval.analysis import tuning as tuning_module
from ripplekv_eval.fastpath import derive as derive_module
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import is_derivable
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.sample import EvalSample, configuration_name
from tests.conftest import random_ids, synthetic_profile, tiny_model
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


def _spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[BasePress], list[BasePress]]:
    """The presses the fast path derives and those it prefills directly, as they come."""
    derived: list[BasePress] = []
    own: list[BasePress] = []
    derive = derive_module.derived_prefill

    def derive_spy(record: Any, press: BasePress) -> Any:
        derived.append(press)
        return derive(record, press)

    def prefill_spy(model: Any, ids: torch.Tensor, press: BasePress) -> Any:
        own.append(press)
        return prefill(model, ids, press)

    monkeypatch.setattr(derive_module, "derived_prefill", derive_spy)
    monkeypatch.setattr(derive_module, "prefill", prefill_spy)
    return derived, own


def _sample(protocol: str) -> tuple[EvalConfig, EvalSample]:
    config = EvalConfig(
        suite="needle", methods=("full", "snapkv"), budgets=(BUDGET,), window_size=WINDOW, protocol=protocol
    )
    ids = tuple(int(t) for t in random_ids(100, seed=6)[0])
    sample = EvalSample(id="s", task="t", input_ids=ids, question_start=90, max_new_tokens=6, score=lambda p: 0.0)
    return config, sample


def _direct_kl(model: Any, protocol: str, sample: EvalSample, tokens: list[int], press: BasePress) -> float:
    """The fidelity of ``press``'s own prefill of the sample, scored directly."""
    ids = sample.input_ids
    context = torch.tensor([list(ids[: sample.question_start] if protocol == "query-agnostic" else ids)])

    def logprobs(press: BasePress) -> torch.Tensor:
        state = prefill(model, context, press)
        if protocol == "query-agnostic":
            state = extend(model, state, torch.tensor([list(ids[sample.question_start :])]))
        return teacher_forced_logprobs(model, state, tokens)

    return fidelity(logprobs(FullPress()), logprobs(press), tokens).kl


@pytest.mark.parametrize("protocol", ["question-aware", "query-agnostic"])
def test_a_press_the_fast_path_does_not_know_runs_its_own_prefill(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=3, seed=4))
    config, sample = _sample(protocol)
    presses = _presses()
    assert [name for (name, _), press in presses.items() if not is_derivable(press)] == NEW
    derived, own = _spy(monkeypatch)
    runner = SampleRunner(config, model, _Tokenizer(), presses)
    assert runner.hidden_tail == WINDOW + 1 and not runner.prescore  # the record does not grow for the new presses
    rows = {configuration_name(r["method"], r["scorer"]): r for r in runner.run_sample(sample, list(presses))}
    assert own == [presses[name, BUDGET] for name in NEW]
    assert [name for name, row in rows.items() if not row["shared_prefill"]] == NEW
    assert all(press in (presses["full", 1.0], presses["snapkv", BUDGET]) for press in derived)

    # each new press's fidelity is that of its own prefill, scored directly
    tokens = rows["full"]["answer_ids"]
    for name in NEW:
        direct = _direct_kl(model, protocol, sample, tokens, presses[name, BUDGET])
        assert rows[name]["fidelity_kl"] == pytest.approx(direct, rel=1e-9, abs=1e-12), name
    # the new scorer keeps other tokens than the SnapKV it subclasses (a fast path taking it for SnapKV would be wrong)
    assert rows["snapkv@new"]["fidelity_kl"] != pytest.approx(rows["snapkv"]["fidelity_kl"], rel=1e-3)


def test_tune_and_damage_run_a_press_the_fast_path_does_not_know_by_its_own_prefill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ripplekv tune`` (the uniform reference, RippleKV's candidates, a rival) and ``ripplekv analyze`` (per-layer
    damage) over the new scorer: each of its presses is prefilled directly, none derived, and scores what its own
    prefill scores; the record does not grow for them. Seeded bug caught: a caller deriving without asking
    ``is_derivable`` (``compressed_prefill`` bypassed)."""
    model = enable_varlen_attention(tiny_model("llama", layers=3, seed=4))
    config, sample = _sample("query-agnostic")
    make = tuning_module.make_press

    def new_scorer(method: str, *args: Any, scorer: Any = None, **kwargs: Any) -> BasePress:
        if method == "full":
            return make(method, *args, **kwargs)
        return make(method, *args, scorer=_HiddenSnapKV(window_size=WINDOW), **kwargs)

    monkeypatch.setattr(tuning_module, "make_press", new_scorer)
    monkeypatch.setattr(damage_module, "make_press", new_scorer)
    derived, own = _spy(monkeypatch)
    tune = tuning_module.TuneConfig(
        eval=config, profiles={"p": "unused.json"}, ratios=(2.0,), gammas=(2.0,), grids=("cake",)
    )
    runner = tuning_module.TuneRunner(tune, {"p": synthetic_profile(model)}, model, _Tokenizer())
    assert runner.hidden_tail == 0 and not runner.prescore  # the full cache's alone
    (row,) = runner.run_sample(sample, [BUDGET])
    candidate = tune.candidates[0].key
    uniform = runner.uniform[BUDGET]
    tuned = {"snapkv": uniform, candidate: runner.presses[candidate, BUDGET], "cake": runner.rivals["cake", BUDGET]}
    compressed = [uniform, *runner.presses.values(), *runner.rivals.values()]
    assert not any(is_derivable(press) for press in compressed) and derived == [runner.full]
    assert all(any(press is p for p in compressed) for press in own)  # one per distinct cache
    assert all(any(press is p for p in own) for press in tuned.values())
    tokens = row["answer_ids"]
    kl = {"snapkv": row["snapkv_kl"], candidate: row["kl"][candidate], "cake": row["kl"]["cake"]}
    for name, press in tuned.items():  # batched teacher forcing: equal to float rounding
        assert kl[name] == pytest.approx(_direct_kl(model, "query-agnostic", sample, tokens, press), rel=1e-4), name

    own.clear()
    derived.clear()
    damage = damage_module.DamageRunner(config, model, _Tokenizer())
    (row,) = damage.run_sample(sample, [BUDGET], tokens)
    assert own == [damage.presses[BUDGET]] and derived == [damage.full]
    assert row["uniform_kl"] == pytest.approx(
        _direct_kl(model, "query-agnostic", sample, tokens, damage.presses[BUDGET]), rel=1e-9, abs=1e-12
    )
