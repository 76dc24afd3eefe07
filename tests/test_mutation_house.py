"""Relations for issue 32's rewritten modules (the traced path, the presses, the fast path), written for the
survivors of its mutation round (docs/mutation.md), and the tuning relation the issue named.

Each test names the seeded bug it was watched failing under.
"""

from __future__ import annotations

import inspect
import re
import time
from dataclasses import FrozenInstanceError, dataclass, replace
from typing import Any

import pytest
import torch
from kvpress import KnormPress, SnapKVPress, StreamingLLMPress
from transformers import DynamicCache

from ripplekv.allocation.budget import BudgetSpec, ProfileSchedule, compression_ratio_keeping
from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv.inference.generate import Prefill, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention, supports_per_layer_lengths
from ripplekv.models.attention_masks import PaddedBatchError
from ripplekv.models.headwise import HeadwiseMask, attention_modules
from ripplekv.models.identity import cached_weights_fingerprint
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.method_spec import METHOD_TABLE, Build, parse_method
from ripplekv.presses.registry import FRACTION_ONLY_METHODS, METHODS, METHODS_WITHOUT_SCORER, make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.presses.selection_window import check_compressible, check_prompt_length, has_padding, selection_window
from ripplekv.profiling.profile import ProfileError, ProfileWeightsWarning
from ripplekv_eval.analysis.tuning import TuneConfig, TuneRunner
from ripplekv_eval.fastpath.batched import decode_row, plan_batches, row_bytes
from ripplekv_eval.fastpath.derive import (
    NotDerivableError,
    compressed_prefill_in_chunks,
    derived_prefill,
    residual_statistics_of,
)
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.fastpath.recording_press import RecordingPress, _Piece, _token_tensors
from ripplekv_eval.fastpath.score_memo import MemoizedScorerPress, ScoreMemo
from ripplekv_eval.reporting.stats import RunStats
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import greedy_agreement
from ripplekv_eval.sample import EvalSample
from tests.conftest import VOCAB, decode_batch, random_ids, synthetic_profile, tiny_model

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


# --- presses/registry.py -------------------------------------------------------------------------------------------


def test_a_build_is_frozen() -> None:
    """What a factory gets cannot be changed under the next factory. Seeded: ``Build`` not frozen (29:18)."""
    build = Build(parse_method("snapkv"), BudgetSpec(0.5), None, 8, False, SnapKVPress)
    with pytest.raises(FrozenInstanceError):
        build.window_size = 4  # type: ignore[misc]


def test_a_window_of_one_token_is_allowed() -> None:
    """``window_size`` is a positive integer: 1 is the smallest allowed. Seeded: ``>= 1`` -> ``>= 2`` (88:60)."""
    press = make_press("snapkv", budget=0.5, window_size=1)
    assert press.press.window_size == 1 and press.floor == 1
    with pytest.raises(ValueError, match="window_size must be a positive integer"):
        make_press("snapkv", budget=0.5, window_size=0)


def test_a_scorer_for_a_method_without_one_names_the_methods_that_take_one() -> None:
    """Seeded: the list of methods with a scorer built with ``in`` for ``not in`` (97:58)."""
    with_scorer = [m for m in METHODS if m not in METHODS_WITHOUT_SCORER]
    assert "snapkv" in with_scorer and "full" not in with_scorer
    with pytest.raises(ValueError, match=re.escape(f"(scorer= applies to {', '.join(with_scorer)})")):
        make_press("full", scorer="knorm")


# --- presses/method_spec.py ----------------------------------------------------------------------------------------


def test_a_method_of_the_table_is_frozen() -> None:
    """Seeded: ``Method`` not frozen (74:18): an entry of the one method table could be changed in place."""
    with pytest.raises(FrozenInstanceError):
        METHOD_TABLE["snapkv"].takes_tokens = False  # type: ignore[misc]


# --- presses/ripplekv_press.py -------------------------------------------------------------------------------------


def test_ripplekv_press_warns_about_other_weights_unless_strict() -> None:
    """RippleKVPress built directly warns, as ``make_press`` does. Seeded: ``strict_profile`` default True (53:27)."""
    profiled = tiny_model("llama", layers=3, seed=11)
    profile = replace(synthetic_profile(profiled), weights_fingerprint=cached_weights_fingerprint(profiled))
    other = tiny_model("llama", layers=3, seed=12)  # same architecture, other weights
    with pytest.warns(ProfileWeightsWarning):
        RippleKVPress(SnapKVPress(window_size=4), 0.3, profile=profile).post_init_from_model(other)
    with pytest.raises(ProfileError, match="other weights"):
        RippleKVPress(SnapKVPress(window_size=4), 0.3, profile=profile, strict_profile=True).post_init_from_model(other)


def test_ripplekv_press_takes_tokens_by_keyword_only() -> None:
    """``tokens`` is keyword-only (a positional number after ``strict_profile`` is refused). Seeded: ``kw_only=False``
    for ``tokens`` (54:53)."""
    parameters = inspect.signature(RippleKVPress).parameters
    assert parameters["tokens"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError):
        RippleKVPress(SnapKVPress(), None, None, (1.0, 2.0), "kl", 4.0, 3.0, False, 8)  # type: ignore[misc]
    assert RippleKVPress(SnapKVPress(), scores=(1.0, 2.0), tokens=8).schedule.spec.tokens == 8


# --- presses/layer_budget_press.py ---------------------------------------------------------------------------------


class _NoWindow(KnormPress):
    window_size = None


def test_a_scorer_without_a_window_has_window_zero() -> None:
    """A scorer with no ``window_size`` (or ``None``) reserves no window: a one-token prompt is compressible.
    Seeded: ``getattr(..., 0)`` -> ``1`` (70:54), ``or 0`` -> ``or 1`` (70:60)."""
    for scorer in (KnormPress(), _NoWindow()):
        press = LayerBudgetPress(scorer, UniformSchedule(tokens=1))
        assert press.window_size == 0 and press.floor == 1
        model = tiny_model("llama", layers=2)
        state = prefill(model, random_ids(1), press)
        assert kept_tokens(state) == [1, 1]


# --- presses/selection_window.py -----------------------------------------------------------------------------------


def test_a_press_without_a_window_needs_none() -> None:
    """Seeded: ``window = 0`` -> ``1`` (14:13), ``getattr(..., 0)`` -> ``1`` (16:63), ``or 0`` -> ``or 1`` (16:69)."""
    for press in (None, KnormPress(), _NoWindow(), LayerBudgetPress(KnormPress())):
        assert selection_window(press) == 0
        check_prompt_length(press, 1)  # a one-token prompt is longer than no window
    assert selection_window(LayerBudgetPress(SnapKVPress(window_size=5))) == 5
    with pytest.raises(ValueError, match="5-token selection window"):
        check_prompt_length(LayerBudgetPress(SnapKVPress(window_size=5)), 5)


def _causal(n: int, padded: int, boolean: bool) -> torch.Tensor:
    """A (1, 1, n, n) causal prefill mask whose first ``padded`` keys are padding (hidden from every query)."""
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    visible[:, :padded] = False
    if boolean:
        return visible[None, None]
    return torch.zeros(n, n).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]


def test_padding_is_read_from_the_last_query_of_bool_and_float_masks() -> None:
    """A causal mask hides later keys from earlier queries without any padding: only the last query's row tells.
    Seeded: the row ``[..., -1, :]`` -> ``[..., 1, :]`` (35:31) or ``[..., -2, :]`` (35:32); the dtype test
    ``==`` -> ``!=`` (36:22); a float mask's visible ``== 0`` -> ``!= 0`` (36:52) or ``== 1`` (36:60)."""
    assert not has_padding(None)
    for boolean in (True, False):
        assert not has_padding(_causal(6, 0, boolean)), boolean
        assert has_padding(_causal(6, 2, boolean)), boolean
    last_only = _causal(6, 0, True)
    last_only[..., -1, 0] = False  # a key hidden from the last query alone (e.g. a left pad seen by no one after)
    assert has_padding(last_only)


def test_a_layer_needs_more_tokens_than_the_window() -> None:
    """Seeded: ``k_len <= window`` -> ``<`` (47:7): a prompt exactly the window's length is refused."""
    press = LayerBudgetPress(SnapKVPress(window_size=8))
    with pytest.raises(ValueError, match="not more than the 8-token selection window"):
        check_compressible(press, {}, 8, 8)
    check_compressible(press, {}, 9, 8)
    with pytest.raises(PaddedBatchError):
        check_compressible(press, {"attention_mask": _causal(9, 1, True)}, 9, 8)


# --- presses/layer_budget_ada_press.py -----------------------------------------------------------------------------


def test_ripplekv_ada_enables_variable_length_attention_on_a_plain_model() -> None:
    """A plain SDPA model is switched to ``ripplekv_sdpa`` whatever the schedule: its layers may differ in length, and
    its masked heads live in the cache layers, which only ripplekv's attention reads. Seeded: the switch dropped (a
    plain model kept its attention and could not attend over layers of different lengths)."""
    for schedule, evict in (
        (ProfileSchedule(0.3, (0.1, 2.0, 0.5)), False),
        (UniformSchedule(0.3), True),
        (UniformSchedule(0.3), False),
    ):
        model = tiny_model("llama", layers=3)
        assert not supports_per_layer_lengths(model)
        press = LayerBudgetAdaPress(SnapKVPress(window_size=4), schedule, evict_balanced=evict)
        press.post_init_from_model(model)
        assert supports_per_layer_lengths(model)


def test_the_scorer_of_ripplekv_ada_is_called_at_the_layers_own_ratio() -> None:
    """A scorer that scores by its ratio (StreamingLLM: sinks and the most recent tokens) keeps exactly its
    selection of the layer's budget in every head. Seeded: ``k_len = keys.shape[2]`` -> ``shape[3]`` (189:27), the
    ratio taken over the head dimension instead of the prompt."""
    model = tiny_model("llama", layers=2)
    ids = random_ids(40, seed=4)
    press = LayerBudgetAdaPress(StreamingLLMPress(n_sink=2), UniformSchedule(tokens=12), alpha_safeguard=1.0)
    state = prefill(model, ids, press)
    full = prefill(model, ids)
    kept = [0, 1, *range(40 - 10, 40)]
    for ours, whole in zip(state.cache.layers, full.cache.layers):
        assert ours.keys.shape[2] == 12
        assert torch.equal(ours.keys, whole.keys[:, :, kept])


def test_balanced_heads_are_evicted_for_every_row_of_a_batch() -> None:
    """Seeded: the gather index expanded to ``(1, -1, -1, d)`` for ``(-1, -1, -1, d)`` (216:46): two equal-length
    prompts, every head balanced (alpha 1), each row keeps what it keeps alone."""
    _assert_rows_select_as_if_alone(
        LayerBudgetAdaPress(SnapKVPress(window_size=4), UniformSchedule(0.4), alpha_safeguard=1.0), (5, 6)
    )


def _assert_rows_select_as_if_alone(press: Any, seeds: tuple[int, int]) -> None:
    """Two equal-length prompts prefilled as one batch under ``press``: each row keeps the keys it keeps alone."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    rows = torch.cat([random_ids(30, seed=seed) for seed in seeds])
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(rows, past_key_values=cache, use_cache=True)
    for row in range(2):
        alone = prefill(model, rows[row : row + 1], press)
        for ours, single in zip(cache.layers, alone.cache.layers):
            assert torch.equal(ours.keys[row : row + 1], single.keys)


# --- models/headwise.py --------------------------------------------------------------------------------------------


def test_a_keep_mask_is_on_the_indices_device_by_default() -> None:
    """Default device: the indices', whatever the default device is. Seeded: ``device is None`` -> ``is not None``
    (56:43): ``keep(length)`` was built on torch's default device."""
    mask = HeadwiseMask((torch.tensor([0, 0]), torch.tensor([1, 0]), torch.tensor([2, 3])), kv_heads=2, length=4)
    expected = torch.tensor([[True, True, True, False, True], [True, True, False, True, True]])
    with torch.device("meta"):
        keep = mask.keep(5)
    assert keep.device.type == "cpu" and torch.equal(keep, expected)
    assert torch.equal(mask.keep(5, device="cpu"), expected) and mask.entries == 2


# --- ripplekv_eval/fastpath/batched.py (tests only: the harness is not edited here) --------------------------------


def _one_layer_state(length: int) -> Prefill:
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, length, 1), torch.zeros(1, 1, length, 1), 0)
    return Prefill(cache, torch.zeros(4), 9000, 0.0)


def test_a_row_joins_a_batch_while_its_padding_costs_at_most_one_step() -> None:
    """A step costs ``STEP_COST_TOKENS`` (8,192) cached tokens plus its rows' padded tokens: one row of 1 token and
    one of 8,193 batch at exactly that cost, one of 8,194 does not. Seeded: 8192 -> 8193 (234:19)."""
    assert plan_batches([_one_layer_state(1), _one_layer_state(8193)]) == [[0, 1]]
    assert plan_batches([_one_layer_state(1), _one_layer_state(8194)]) == [[0], [1]]


def test_one_row_per_batch_and_one_new_token_decode_and_a_row_needs_no_room() -> None:
    """One row alone and a one-token decode equal greedy decoding. Seeded: ``room`` checked ``>= 1`` (172:28)."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    states = [prefill(model, random_ids(20, seed=s)) for s in (1, 2)]
    alone = [greedy_decode(model, s, 3, set()) for s in states]
    assert [decode_batch(model, [state], 3, set())[0] for state in states] == alone
    assert decode_batch(model, states, 1, set()) == [tokens[:1] for tokens in alone]
    for state in states:
        assert row_bytes(state, 0) == decode_row(state, 0).nbytes()


# --- ripplekv_eval/fastpath/record.py (tests only) ------------------------------------------------------------------


def _mean_norm(inputs: torch.Tensor, attention: torch.Tensor) -> float:
    """A plain residual statistic (not a TokenStatistic): computable over one pass only."""
    return float(attention.norm(dim=-1).mean())


def test_a_plain_residual_statistic_needs_one_pass() -> None:
    """Over a prompt within one chunk, a plain statistic is computed once per layer on the whole prompt; over two
    chunks or more it is refused, by name. Seeded: ``len(chunk_bounds(...)) > 1`` -> ``>= 1`` (90:14) or ``> 2``
    (90:49); ``chunked and residual_statistics`` -> ``or`` (91:7); ``not isinstance(fn, TokenStatistic)`` ->
    ``isinstance`` (92:75); ``if not chunked`` -> ``if chunked`` in the hook (114:19)."""
    model = tiny_model("llama", layers=2)
    ids = random_ids(16, seed=2)
    for chunk in (None, 16, 40):
        record = record_prefill(model, ids, 0, {"norm": _mean_norm}, prefill_chunk=chunk)
        values = [layer.statistics["norm"] for layer in record.layers]
        assert all(isinstance(v, float) and v > 0 for v in values) and values[0] != values[1]
    for chunk in (8, 15):  # two chunks (the mutant > 2 would take them for one pass), and two uneven ones
        with pytest.raises(ValueError, match=r"residual statistic\(s\) norm cannot be computed"):
            record_prefill(model, ids, 0, {"norm": _mean_norm}, prefill_chunk=chunk)
    token = residual_statistics_of([make_press("squeezeattention", budget=0.5, window_size=4)])
    assert all(isinstance(fn, TokenStatistic) for fn in token.values())
    record_prefill(model, ids, 0, token, prefill_chunk=8)  # per-token statistics: chunks allowed


def test_a_chunked_record_keeps_the_last_positions_logits_and_its_own_time() -> None:
    """Seeded: ``logits[0, -1]`` -> ``logits[0, 1]`` (132:45) and ``perf_counter() - start`` -> ``+`` (132:50) in
    the chunked branch."""
    model = tiny_model("llama", layers=2)
    ids = random_ids(24, seed=8)
    one = record_prefill(model, ids, 0, prefill_chunk=None)
    started = time.perf_counter()
    chunked = record_prefill(model, ids, 0, prefill_chunk=10)  # chunks of 10, 10, 4
    took = time.perf_counter() - started
    assert torch.allclose(chunked.next_logits, one.next_logits, atol=1e-5)
    assert 0 <= chunked.seconds <= took and one.seconds >= 0


def test_a_records_bookkeeping_is_not_part_of_its_identity() -> None:
    """``invalid``, ``memo`` and ``prescored`` are left out of equality. Seeded: ``compare=False`` -> ``True`` for
    ``invalid`` (39:54)."""
    record = record_prefill(tiny_model("llama", layers=2), random_ids(12, seed=9), 0)
    assert replace(record, invalid="a press wrote into it") == record
    assert replace(record, memo=ScoreMemo(), prescored=frozenset({"x"})) == record
    assert replace(record, prompt_tokens=11) != record


def test_the_hidden_tail_of_a_one_layer_record() -> None:
    """Seeded: ``self.layers[0]`` -> ``self.layers[1]`` (46:31): a model of one layer has no layer 1."""
    record = record_prefill(tiny_model("llama", layers=1), random_ids(12, seed=10), 5)
    assert record.hidden_tokens == 5
    assert record_prefill(tiny_model("llama", layers=1), random_ids(12, seed=10), None).hidden_tokens == 12


# --- ripplekv_eval/fastpath/derive.py (tests only) ------------------------------------------------------------------


def test_a_derivation_reports_its_own_time_on_top_of_the_records() -> None:
    """Seeded: ``perf_counter() - start`` -> ``+`` (121:14), ``record.seconds + seconds`` -> ``-`` (122:77)."""
    model = tiny_model("llama", layers=2)
    record = record_prefill(model, random_ids(20, seed=12))
    started = time.perf_counter()
    state, seconds = derived_prefill(record, make_press("snapkv", budget=0.5, window_size=4))
    assert 0 <= seconds <= time.perf_counter() - started
    assert state.seconds == record.seconds + seconds


def test_a_per_prompt_press_derives_past_a_sliding_layer_onto_one_compressed_layer() -> None:
    """A sliding layer first (left whole, the loop goes on) and a single compressed layer (its length read from
    it). Seeded: ``continue`` -> ``break`` (202:12), ``compressed[0]`` -> ``compressed[1]`` (197:61)."""
    model = tiny_model("gemma3", layers=2, layer_types=["sliding_attention", "full_attention"])
    ids = random_ids(30, seed=13)
    for name in ("cake", "lava-layer"):
        press = make_press(name, budget=0.4, window_size=4)
        press.post_init_from_model(model)
        derived = derived_prefill(record_prefill(model, ids), press)[0]
        direct = prefill(model, ids, press)
        assert kept_tokens(derived) == kept_tokens(direct) and kept_tokens(direct)[0] == 30, name
        assert kept_tokens(direct)[1] < 30, name
        for ours, theirs in zip(derived.cache.layers, direct.cache.layers):
            assert torch.allclose(ours.keys, theirs.keys, atol=1e-6), name


# --- ripplekv_eval/fastpath/recording_press.py, score_memo.py; reporting/stats.py (tests only) ----------------------


def test_a_recorded_tail_cuts_each_shared_kwarg_once_for_every_layer() -> None:
    """Position embeddings (one tensor pair for every layer) are cut to the tail once and shared by the layers'
    records. Seeded: the cut memo checked against its copy (``held[0]`` -> ``held[1]``, 114:32), a new copy per
    layer."""
    record = record_prefill(tiny_model("llama", layers=3), random_ids(20, seed=14), 5)
    cos = [layer.kwargs["position_embeddings"][0] for layer in record.layers]
    assert cos[0].shape[1] == 5 and all(c is cos[0] for c in cos)


def test_a_two_dimensional_per_query_embedding_is_cut_too() -> None:
    """Seeded: ``t.dim() >= 2`` -> ``> 2`` (122:51): a ``(batch, queries)`` position embedding was kept whole."""
    press = RecordingPress()
    flat, batched, other = torch.arange(6.0).reshape(1, 6), torch.zeros(1, 6, 2), torch.zeros(1, 3, 2)
    cut = press._cut_kwarg("position_embeddings", (flat, batched, other), 6, 4)
    assert torch.equal(cut[0], flat[:, 4:]) and cut[1].shape == (1, 2, 2) and cut[2] is other


def test_values_not_indexed_by_a_chunks_positions_are_no_token_tensors() -> None:
    """Seeded: ``or`` -> ``and`` in the rank check (58:11): a value of too low a rank, or no tensor, is refused."""
    pieces = [_Piece(torch.nn.Identity(), 0, 3, torch.zeros(1, 3, 2), None, {})]
    assert _token_tensors([torch.zeros(1, 3, 2)], pieces, 1)
    assert not _token_tensors([torch.zeros(3)], pieces, 1)
    assert not _token_tensors([None], pieces, 1)


def test_a_memoized_scorer_reports_its_scorers_window() -> None:
    """Budget presses read their floor from it. Seeded: ``or 0`` -> ``and 0`` (142:19): always 0."""
    assert MemoizedScorerPress(press=SnapKVPress(window_size=7), memo=ScoreMemo()).window_size == 7
    assert MemoizedScorerPress(press=KnormPress(), memo=ScoreMemo()).window_size == 0


def test_run_statistics_count_no_incomplete_sample_by_default() -> None:
    """Seeded: ``incomplete: int = 0`` -> ``1`` (546:22)."""
    assert RunStats(2000, 0, 0.95, {}, {}, {}).incomplete == 0


def test_a_chunked_eager_record_joins_the_attention_weights_along_the_queries() -> None:
    """Seeded: the chunks' weights joined along dim ``-3`` for ``-2`` (250:80)."""
    model = tiny_model("llama", layers=2, attn="eager")
    ids = random_ids(24, seed=15)
    one = record_prefill(model, ids, 10, prefill_chunk=None)
    chunked = record_prefill(model, ids, 10, prefill_chunk=7)
    for want, got in zip(one.layers, chunked.layers):
        assert got.attentions.shape == want.attentions.shape == (1, 4, 10, 24)
        assert torch.allclose(got.attentions, want.attentions, atol=1e-5)


# --- round 2 (its survivors, against round 1's tests) ------------------------------------------------------------


def test_a_record_takes_one_unpadded_sequence_of_one_token_or_more() -> None:
    """Seeded: the shape check's ``or`` -> ``and`` (87:7), ``shape[1] < 1`` -> ``<= 1`` (87:58) or ``< 2``
    (87:79)."""
    model = tiny_model("llama", layers=2)
    assert record_prefill(model, random_ids(1), 0).prompt_tokens == 1
    for bad in (random_ids(5)[0], torch.cat([random_ids(5), random_ids(5)]), random_ids(0)):
        with pytest.raises(ValueError, match="expected one non-empty unpadded sequence"):
            record_prefill(model, bad, 0)


def test_a_records_and_a_memoized_scorers_memo_are_bookkeeping() -> None:
    """Neither printed nor compared. Seeded: ``repr=False`` -> ``True`` for the record's memo (40:75), the memoized
    scorer's ``repr=False`` (132:60) and ``compare=False`` (132:75) -> ``True``."""
    record = record_prefill(tiny_model("llama", layers=2), random_ids(8, seed=1), 0)
    assert "memo=" not in repr(record)
    scorer = SnapKVPress(window_size=4)
    one, two = MemoizedScorerPress(press=scorer, memo=ScoreMemo()), MemoizedScorerPress(press=scorer, memo=ScoreMemo())
    assert one == two and "memo=" not in repr(one)


def test_row_bytes_count_the_room_and_the_masks_of_a_row() -> None:
    """``row_bytes`` is what ``decode_row`` holds, with room for new tokens and a head-wise validity per masked
    layer. Seeded: ``length + room`` -> ``-`` (178:17), ``kv_heads * length`` -> ``/`` (178:48)."""
    model = tiny_model("llama", layers=2)
    ids = random_ids(30, seed=2)
    for name in ("snapkv", "adakv"):
        state = prefill(model, ids, make_press(name, budget=0.5, window_size=4))
        for room in (0, 3):
            assert row_bytes(state, room) == decode_row(state, room).nbytes(), (name, room)


def test_a_stop_id_past_the_vocabulary_is_never_banned() -> None:
    """Seeded: ``0 <= i < vocab`` -> ``<= vocab`` (328:56): a stop id equal to the vocabulary size was banned."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    states = [prefill(model, random_ids(12, seed=s)) for s in (3, 4)]
    stops = {VOCAB, VOCAB + 5}
    got = decode_batch(model, states, 3, stops, min_new_tokens=2)
    assert got == [greedy_decode(model, s, 3, stops, min_new_tokens=2) for s in states]


@dataclass
class _OwnSnapKV(SnapKVPress):
    """A scorer the fast path's tables were not read from."""


def test_a_chunked_derivation_refuses_a_press_the_fast_path_does_not_know() -> None:
    """Seeded: ``not is_derivable(press)`` -> ``is_derivable(press)`` (142:7)."""
    model = tiny_model("llama", layers=2)
    with pytest.raises(NotDerivableError):
        compressed_prefill_in_chunks(model, random_ids(20), LayerBudgetPress(_OwnSnapKV(window_size=4)), 8)
    compressed_prefill_in_chunks(model, random_ids(20), LayerBudgetPress(SnapKVPress(window_size=4)), 8)


def test_layer_budget_press_selects_every_row_of_a_batch_as_if_alone() -> None:
    """Seeded: the gather index expanded to ``(1, -1, -1, d)`` for ``(-1, -1, -1, d)`` (132:75)."""
    _assert_rows_select_as_if_alone(LayerBudgetPress(SnapKVPress(window_size=4), UniformSchedule(0.4)), (7, 8))


def test_kvpress_own_presses_take_fractions_only() -> None:
    """Seeded: ``takes_tokens=False`` -> ``True`` for pyramidkv-kvpress (135:21)."""
    assert set(FRACTION_ONLY_METHODS) == {"streamingllm", "pyramidkv-kvpress", "adakv"}


def test_a_headwise_mask_is_frozen_and_a_model_without_layers_has_no_attention_modules() -> None:
    """Seeded: ``HeadwiseMask`` not frozen (26:18); ``layers is None or ...`` -> ``and`` (96:7)."""
    mask = HeadwiseMask((torch.tensor([0]), torch.tensor([0]), torch.tensor([1])), kv_heads=1, length=2)
    with pytest.raises(FrozenInstanceError):
        mask.length = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="cannot find the attention modules of Linear"):
        attention_modules(torch.nn.Linear(2, 2))


RATIOS: list[float] = []


@dataclass
class _RatioSpy(KnormPress):
    """Knorm's scores; notes the ratio each copy scores at."""

    def score(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        RATIOS.append(self.compression_ratio)
        return super().score(*args, **kwargs)


def test_ripplekv_ada_scores_a_one_token_layer_at_its_own_ratio() -> None:
    """The scorer of a layer keeping one token of 40 scores at the ratio that keeps one. Seeded: ``max(1, ...)`` ->
    ``max(2, ...)`` (191:73): scored as if keeping two."""
    RATIOS.clear()
    press = LayerBudgetAdaPress(_RatioSpy(), UniformSchedule(tokens=1), alpha_safeguard=1.0)
    state = prefill(tiny_model("llama", layers=2), random_ids(40, seed=9), press)
    assert kept_tokens(state) == [1, 1]
    assert [compression_ratio_keeping(1, 40)] * 2 == RATIOS


# Round 3's survivors (per_prompt_press.py)


def test_a_per_prompt_press_over_a_windowless_scorer_observes_kvpress_snapkv_default_window() -> None:
    """The statistics' window under a scorer without one is 64, SnapKV's default in kvpress. Seeded: 64 -> 65 (53)."""
    from ripplekv.allocation.cake import CakeRule
    from ripplekv.allocation.per_prompt import PerPromptSchedule
    from ripplekv.presses.per_prompt_press import PerPromptBudgetPress

    press = PerPromptBudgetPress(KnormPress(), PerPromptSchedule(CakeRule(), 0.5, window_size=0))
    assert press.statistic_window == SnapKVPress().window_size == 64
    assert press.floor == 1


@pytest.mark.parametrize("floor", [0, -3, 2.5])
def test_per_prompt_floor_must_be_a_whole_number_of_at_least_one(floor: float) -> None:
    """A whole number below 1 and a fraction above 1 are both refused. Seeded: the check's ``or`` -> ``and`` (132)."""
    from ripplekv.allocation.cake import CakeRule
    from ripplekv.allocation.per_prompt import PerPromptSchedule
    from ripplekv.presses.per_prompt_press import PerPromptBudgetPress

    with pytest.raises(ValueError, match="floor must be an integer >= 1"):
        PerPromptBudgetPress(KnormPress(), PerPromptSchedule(CakeRule(), 0.5, window_size=0), floor=floor)


# Round 3's survivors (the rest)


def test_a_two_layer_pyramid_is_not_flat() -> None:
    """Two layers make a pyramid of two distinct capacities, rescaled, not a flat one. Seeded: the flat test
    ``len(set(capacities)) == 1`` -> ``== 2`` (schedules.py:94)."""
    from ripplekv.allocation.schedules import PyramidSchedule

    schedule = PyramidSchedule(budget=0.5, window_size=4, beta=20)
    first, second = schedule.capacities(2, 100)
    assert first > second
    budgets = schedule.layer_budgets(2, 100, 4)
    assert budgets[0] > budgets[1] and sum(budgets) == 2 * 50


def test_lava_token_scores_are_float64_by_default() -> None:
    """LAVa's scores are computed in float64 unless a dtype is given. Seeded: ``dtype is None`` -> ``is not None``
    (lava.py:74): computed in the inputs' float32."""
    from ripplekv.allocation.lava import lava_token_scores

    attention = torch.softmax(torch.randn(1, 4, 3, 10), dim=-1)
    values = torch.randn(1, 2, 13, 8)
    assert lava_token_scores(attention, values).dtype == torch.float64
    assert lava_token_scores(attention, values, dtype=torch.float32).dtype == torch.float32


def test_kvpress_pyramid_takes_no_scorer() -> None:
    """kvpress's PyramidKVPress scores with its own SnapKV: ``scorer=`` is refused by name. Seeded: its
    ``has_scorer=False`` -> ``True`` (method_spec.py:136)."""
    assert "pyramidkv-kvpress" in METHODS_WITHOUT_SCORER
    with pytest.raises(ValueError, match="has no token scorer to replace"):
        make_press("pyramidkv-kvpress", budget=0.3, scorer="knorm")


# Round 4's survivors


def test_stop_id_zero_is_banned_in_a_batch_like_any_other() -> None:
    """Token 0 made the greedy first pick; as a stop id it is banned for the first ``min_new_tokens`` in a batch
    as alone. Seeded: ``0 <= i < vocab`` -> ``1 <= i`` (batched.py:298): token 0 was never banned."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    first = greedy_decode(model, prefill(model, random_ids(12, seed=3)), 1, set())[0]
    with torch.no_grad():
        model.lm_head.weight[0] = 3.0 * model.lm_head.weight[first]  # token 0's logit: 3x the first pick's
    states = [prefill(model, random_ids(12, seed=s)) for s in (3, 4)]
    assert greedy_decode(model, states[0], 1, set()) == [0]
    alone = [greedy_decode(model, s, 3, {0}, min_new_tokens=2) for s in states]
    assert alone[0][0] != 0
    assert decode_batch(model, states, 3, {0}, min_new_tokens=2) == alone


def test_a_per_prompt_press_takes_no_pending_state_and_a_copy_has_its_own() -> None:
    """The state of a prefill in progress is neither a constructor argument nor shared by ``replace``. Seeded:
    ``_pending``'s ``init=False`` -> ``True`` (per_prompt_press.py:114): ``replace`` handed the copy the same dict."""
    from ripplekv.allocation.cake import CakeRule
    from ripplekv.allocation.per_prompt import PerPromptSchedule
    from ripplekv.presses.per_prompt_press import PerPromptBudgetPress

    press = PerPromptBudgetPress(KnormPress(), PerPromptSchedule(CakeRule(), 0.5, window_size=0))
    assert "_pending" not in inspect.signature(PerPromptBudgetPress).parameters
    assert replace(press, floor=2)._pending is not press._pending


def test_ripplekv_ada_scores_a_sliding_layer_keeping_everything() -> None:
    """A sliding-window layer has no budget: scored directly, its scorer runs at ratio 0 (keeps every token).
    Seeded: ``0.0 if n_kept is None`` -> ``1.0`` (layer_budget_ada_press.py:191)."""
    RATIOS.clear()
    model = tiny_model("gemma3", layers=2, layer_types=["sliding_attention", "full_attention"])
    press = LayerBudgetAdaPress(_RatioSpy(), UniformSchedule(budget=0.5))
    keys, values = torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 32)
    press.score(model.model.layers[0].self_attn, torch.randn(1, 10, 64), keys, values, None, {})
    assert RATIOS == [0.0]
