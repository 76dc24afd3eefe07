"""Relations that kill mutants of issue 26's inference modules left alive by its first mutation round.

Each test names the seeded bug it was checked to catch: the validation boundaries of the query moments and their
press (with their messages), what the moments merge at the edge of the sinks, how many trailing hidden positions a
press needs as a function of its window, which scorers a record prescores, a one-chunk prefill being the plain
forward (and the chunks a hook is told of), a ragged layer's rows holding exactly what was written, and the rows of
a shared prefix's value delta reaching the right batch rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    PyramidKVPress,
    QFilterPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress
from kvpress.utils import get_prerope_query_states
from transformers import DynamicCache

import ripplekv.models.shared_prefix as shared_prefix_module
from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.models.cache import cache_tensors
from ripplekv.models.chunked_prefill import chunk_bounds, prefill_in_chunks
from ripplekv.models.shared_prefix import SharedPrefix, shared_prefix_attention
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv_eval.fastpath.batched import pad_layers
from ripplekv_eval.fastpath.hidden_tail import hidden_states_needed, is_derivable, prescored_scorers
from ripplekv_eval.fastpath.padded import RaggedLayer
from ripplekv_eval.fastpath.recording_press import MomentsExpectedAttentionPress, QueryMoments
from ripplekv_eval.fastpath.score_memo import scorer_key
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------ query moments


@pytest.mark.parametrize("n_sink", [-1, True, 1.5, "2"], ids=repr)
def test_query_moments_refuse_a_sink_count_that_is_not_an_integer_at_least_zero(n_sink: Any) -> None:
    """``n_sink`` must be an int >= 0 (a bool refused), each failing alone. Seeded bug: ``or`` -> ``and`` in the
    check (no single failure refused)."""
    with pytest.raises(ValueError, match=f"n_sink must be an integer >= 0, got {n_sink!r}"):
        QueryMoments(n_sink)
    assert QueryMoments(0).n_sink == 0


def _one_pass(module: Any, hidden: torch.Tensor, n_sink: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kvpress's pre-RoPE query mean and covariance over the positions after the sinks, in one pass."""
    with torch.no_grad():
        queries = get_prerope_query_states(module, hidden[:, n_sink:])
    mu = queries.mean(dim=2)
    centred = queries - mu.unsqueeze(2)
    return mu, torch.einsum("bhsi,bhsj->bhij", centred, centred) / queries.shape[2]


def test_a_chunk_ending_exactly_at_the_last_sink_merges_nothing() -> None:
    """Chunks ``[0, 4)`` and ``[2, 4)`` with ``n_sink=4`` hold only sinks: nothing is merged (still nothing to give),
    and after the rest of the prompt the statistics equal the one pass over the positions after the sinks.
    Seeded bug: ``skip >= n`` -> ``skip > n`` (an empty chunk merged: its NaN mean spoils every later merge)."""
    model = tiny_model("llama", layers=1, seed=3).double()
    module = model.model.layers[0].self_attn
    hidden = torch.randn(1, 20, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    moments = QueryMoments(4)
    moments.update(module, hidden[:, :4], 0)
    moments.update(module, hidden[:, 2:4], 2)
    assert moments.count == 0 and moments.mean is None
    with pytest.raises(ValueError, match="no query after the first 4 prompt positions was merged"):
        moments.statistics()
    moments.update(module, hidden[:, 4:11], 4)
    moments.update(module, hidden[:, 11:], 11)
    assert moments.count == 16
    mu, cov = moments.statistics()
    want_mu, want_cov = _one_pass(module, hidden, 4)
    torch.testing.assert_close(mu, want_mu, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(cov, want_cov, atol=1e-10, rtol=1e-10)


def test_the_moments_repr_names_the_count_and_dtype_but_not_the_tensors() -> None:
    """``repr`` shows ``n_sink``, ``count`` and ``dtype``, never the mean or second moment (a (heads, dim, dim) tensor
    per layer in every log line). Seeded bugs: ``repr=False`` -> ``True`` on ``mean``; on ``m2``."""
    mean, m2 = torch.zeros(1, 2, 3, dtype=torch.float64), torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    moments = QueryMoments(2, count=3, mean=mean, m2=m2, dtype=torch.float32)
    assert repr(moments) == "QueryMoments(n_sink=2, count=3, dtype=torch.float32)"


@pytest.mark.parametrize("held", ["mean", "m2"])
def test_moments_holding_only_a_mean_or_only_a_second_moment_start_over_at_the_next_chunk(held: str) -> None:
    """Moments missing the mean or the second moment hold nothing to merge into: the next chunk starts them over,
    and the statistics are that chunk's alone (the one pass over it). Seeded bug: ``or`` -> ``and`` in ``update``'s
    check (the half-set moments merged into: ``None`` in the arithmetic)."""
    model = tiny_model("llama", layers=1, seed=3).double()
    module = model.model.layers[0].self_attn
    hidden = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    stale = {"mean": torch.ones(1, 4, 16, dtype=torch.float64), "m2": torch.ones(1, 4, 16, 16, dtype=torch.float64)}
    moments = QueryMoments(0, count=7, **{held: stale[held]})  # type: ignore[arg-type]
    moments.update(module, hidden, 0)
    assert moments.count == 9
    mu, cov = moments.statistics()
    want_mu, want_cov = _one_pass(module, hidden, 0)
    torch.testing.assert_close(mu, want_mu, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(cov, want_cov, atol=1e-10, rtol=1e-10)


def test_statistics_refuse_moments_missing_any_of_mean_second_moment_or_dtype() -> None:
    """``statistics`` gives ``(mean, m2 / count)`` in the queries' dtype only when all three are set; moments missing
    any one of them are refused with the message, not read. Seeded bug: ``or`` -> ``and`` in the check (a missing
    dtype or mean passes it)."""
    mean, m2 = torch.full((1, 2, 3), 2.0, dtype=torch.float64), torch.full((1, 2, 3, 3), 6.0, dtype=torch.float64)
    complete = QueryMoments(0, count=3, mean=mean, m2=m2, dtype=torch.float32)
    mu, cov = complete.statistics()
    assert mu.dtype == cov.dtype == torch.float32
    assert torch.equal(mu, mean.float()) and torch.equal(cov, (m2 / 3).float())
    for missing in ({"dtype": None}, {"mean": None}, {"m2": None}):
        fields = {"count": 3, "mean": mean, "m2": m2, "dtype": torch.float32, **missing}
        with pytest.raises(ValueError, match="no query after the first 0 prompt positions was merged"):
            QueryMoments(0, **fields).statistics()  # type: ignore[arg-type]


@pytest.mark.parametrize("prompt_tokens", [0, -3, True, 2.0], ids=repr)
def test_the_moments_press_refuses_a_prompt_length_that_is_not_an_integer_at_least_one(prompt_tokens: Any) -> None:
    """``prompt_tokens`` must be an int >= 1 (a bool refused), each failing alone; 1 is accepted. Seeded bug: ``or``
    -> ``and`` in the check."""
    moments = QueryMoments(2)
    with pytest.raises(ValueError, match=f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}"):
        MomentsExpectedAttentionPress(n_sink=2, moments=moments, prompt_tokens=prompt_tokens)
    assert MomentsExpectedAttentionPress(n_sink=2, moments=moments, prompt_tokens=1).prompt_tokens == 1


def test_the_moments_press_has_no_default_prompt_length() -> None:
    """Without ``prompt_tokens`` the press is refused: the averaged RoPE has no position to start from. Seeded bug: a
    default of 1 (the press built, the RoPE averaged from position 1 whatever the prompt)."""
    with pytest.raises(ValueError, match="prompt_tokens must be an integer >= 1, got 0"):
        MomentsExpectedAttentionPress(n_sink=2, moments=QueryMoments(2))


# --------------------------------------------------------------------------------------- hidden states a press reads


@pytest.mark.parametrize("window", [0, 1, 5, 64])
def test_the_hidden_positions_a_scorer_reads_follow_its_window(window: int) -> None:
    """SnapKV and PyramidKV read ``window + 1`` trailing positions, TOVA the last one, the key- and position-only
    scorers (KNorm, KeyDiff, StreamingLLM, QFilter, Random, the full cache) none, ExpectedAttention all (None).
    Seeded bug: QFilter's entry ``0`` -> ``1``."""
    assert hidden_states_needed(SnapKVPress(window_size=window)) == window + 1
    assert hidden_states_needed(PyramidKVPress(window_size=window)) == window + 1
    assert hidden_states_needed(TOVAPress()) == 1
    for press in (KnormPress(), KeyDiffPress(), StreamingLLMPress(), QFilterPress(), RandomPress(), FullPress()):
        assert hidden_states_needed(press) == 0, type(press).__name__
    assert hidden_states_needed(ExpectedAttentionPress()) is None


@dataclass
class _Knorm(KnormPress):
    """A KNorm subclass: not in the tables, whatever it inherits."""


def test_a_subclass_of_a_listed_scorer_reads_every_position_and_is_not_derived() -> None:
    """The tables match exact classes: a subclass of KNorm (which reads no hidden state) is taken to read them all,
    and neither it nor a schedule over it is derived. Seeded bug: the table looked up with ``isinstance``."""
    assert hidden_states_needed(_Knorm()) is None
    assert not is_derivable(_Knorm()) and not is_derivable(LayerBudgetPress(_Knorm()))
    assert is_derivable(KnormPress()) and is_derivable(LayerBudgetPress(KnormPress()))


def _per_prompt(scorer: Any, statistic_window: int | None) -> PerPromptBudgetPress:
    """CAKE over ``scorer`` with the rule's window statistics over the last ``statistic_window`` positions."""
    reserve = int(getattr(scorer, "window_size", 0) or 0)
    schedule = PerPromptSchedule(CakeRule(), 0.3, window_size=reserve)
    return PerPromptBudgetPress(scorer, schedule, statistic_window=statistic_window)


@pytest.mark.parametrize("statistic_window", [1, 3, 20])
def test_a_per_prompt_press_needs_its_scorers_tail_and_its_statistics_window_plus_one(statistic_window: int) -> None:
    """A per-prompt press reads ``max(scorer's need, window + 1)``: KNorm (0) gives ``window + 1``; SnapKV with an
    8-token window at least 9; ExpectedAttention all, or ``window + 1`` once the record prescored it.
    Seeded bug: ``window + 1`` -> ``window - 1``."""
    assert hidden_states_needed(_per_prompt(KnormPress(), statistic_window)) == statistic_window + 1
    snap = _per_prompt(SnapKVPress(window_size=8), statistic_window)
    assert hidden_states_needed(snap) == max(9, statistic_window + 1)
    expected = ExpectedAttentionPress()
    press = _per_prompt(expected, statistic_window)
    assert hidden_states_needed(press) is None
    assert hidden_states_needed(press, frozenset({scorer_key(expected)})) == statistic_window + 1


def test_the_scorers_a_record_prescores_are_those_scored_through_the_memo() -> None:
    """ExpectedAttention is prescored under the presses whose scorer the fast path hands the record's memo (a
    schedule, a per-prompt press, kvpress's AdaKV, also inside GlobalLayersPress), one per scorer key; never a bare
    scorer (kvpress's ``compress`` scores it itself). Seeded bugs: ``or`` -> ``and`` in ``memo_scored`` (a
    per-prompt press's scorer missed); ``inner is not None`` -> ``inner is None`` (a wrapped AdaKV's scorer
    missed)."""
    scorer = ExpectedAttentionPress()
    assert prescored_scorers([LayerBudgetPress(scorer)]) == (scorer,)
    assert prescored_scorers([_per_prompt(scorer, None)]) == (scorer,)
    assert prescored_scorers([AdaKVPress(scorer)]) == (scorer,)
    assert prescored_scorers([GlobalLayersPress(AdaKVPress(scorer))]) == (scorer,)
    assert prescored_scorers([scorer, GlobalLayersPress(scorer)]) == ()
    same = ExpectedAttentionPress()  # equal settings: the same key, prescored once
    assert prescored_scorers([LayerBudgetPress(scorer), _per_prompt(same, 4)]) == (scorer,)
    other = ExpectedAttentionPress(n_sink=2)
    assert prescored_scorers([LayerBudgetPress(scorer), LayerBudgetPress(other)]) == (scorer, other)


@dataclass
class _Holder(BasePress):
    """A press outside the fast path's tables that holds another press (it may score it however it likes)."""

    press: BasePress


def test_a_press_outside_the_wrappers_is_not_looked_into_for_memoized_scorers() -> None:
    """A press the tables do not list, holding a schedule over ExpectedAttention, compresses outside the record's
    memo: its ExpectedAttention is not prescored (and it reads every position), and it is not derived. Seeded bug:
    ``kind in _WRAPPERS and inner is not None`` -> ``or`` (any press with an inner press looked into)."""
    held = _Holder(LayerBudgetPress(ExpectedAttentionPress()))
    assert prescored_scorers([held]) == ()
    assert hidden_states_needed(held) is None and not is_derivable(held)


# ------------------------------------------------------------------------------------------------ chunked prefill


def _prefill_calls(model: Any, ids: torch.Tensor, chunk: int | None) -> tuple[Any, torch.Tensor, list[tuple[int, int]]]:
    """``prefill_in_chunks``'s cache and logits, and the ``(start, end)`` its ``before_chunk`` was called with."""
    calls: list[tuple[int, int]] = []
    cache, logits = prefill_in_chunks(model, ids, chunk, before_chunk=lambda start, end: calls.append((start, end)))
    return cache, logits, calls


def test_a_one_chunk_prefill_is_the_plain_forward_and_hooks_see_every_chunk() -> None:
    """Within the chunk (or without one) the prefill is the plain forward bit for bit; ``before_chunk`` is told
    exactly :func:`chunk_bounds` of the prompt, one call per chunk. Seeded bugs: ``len(bounds) == 1`` -> ``== 2`` (a
    two-chunk prompt run in one pass, its hook told of one chunk); ``before_chunk(0, tokens)`` -> ``(1, tokens)``."""
    model = tiny_model("llama", layers=2, seed=5)
    ids = random_ids(12, seed=2)
    with torch.no_grad():
        plain_cache = DynamicCache()
        plain = model(ids, past_key_values=plain_cache, use_cache=True, logits_to_keep=1).logits
    for chunk in (None, 12, 40):
        cache, logits, calls = _prefill_calls(model, ids, chunk)
        assert calls == [(0, 12)]
        assert torch.equal(logits, plain)
        for (k, v), (pk, pv) in zip(cache_tensors(cache), cache_tensors(plain_cache), strict=True):
            assert torch.equal(k, pk) and torch.equal(v, pv)
    for chunk in (6, 5, 4):
        calls = _prefill_calls(model, ids, chunk)[2]
        assert calls == list(chunk_bounds(12, chunk)) and len(calls) == -(-12 // chunk)


@pytest.mark.parametrize(("shape", "message"), [((5,), r"got \(5,\)"), ((1, 0), r"got \(1, 0\)")])
def test_prefill_refuses_ids_that_are_not_a_nonempty_batch_of_rows(shape: tuple[int, ...], message: str) -> None:
    """Prompt ids must be ``(batch, n)`` with ``n >= 1``; each failure alone is refused with the message. Seeded bug:
    ``or`` -> ``and`` in the check (1-D ids reach ``shape[1]``; empty rows reach ``chunk_bounds``)."""
    model = tiny_model("llama", layers=1, seed=5)
    with pytest.raises(ValueError, match=r"expected prompt ids of shape \(batch, n\), n >= 1, " + message):
        prefill_in_chunks(model, torch.zeros(shape, dtype=torch.long), None)


# ------------------------------------------------------------------------------------------------- ragged layers


def test_a_ragged_layers_rows_hold_exactly_what_was_written_to_them() -> None:
    """Each row of a :class:`RaggedLayer` reads back its own keys and values, ``(1, kv_heads, n_row, dim)``, then
    those followed by the tokens appended to it. Seeded bug: the value buffer of 2 rows, not 1 (every row's values
    read back twice)."""
    generator = torch.Generator().manual_seed(6)
    lengths = (3, 5)
    rows = [
        (torch.randn(1, 2, n, 4, generator=generator), torch.randn(1, 2, n, 6, generator=generator), None)
        for n in lengths
    ]
    layer = RaggedLayer(rows, room=2)
    for index, (keys, values, _) in enumerate(rows):
        got_keys, got_values = layer.row(index)
        assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
    new_keys, new_values = torch.randn(2, 2, 2, 4, generator=generator), torch.randn(2, 2, 2, 6, generator=generator)
    layer.update(new_keys, new_values)
    for index, (keys, values, _) in enumerate(rows):
        got_keys, got_values = layer.row(index)
        assert torch.equal(got_keys, torch.cat([keys, new_keys[index : index + 1]], dim=2))
        assert torch.equal(got_values, torch.cat([values, new_values[index : index + 1]], dim=2))


def test_padding_one_row_gives_it_back_and_a_mismatch_is_named_by_its_row() -> None:
    """One row pads to itself (all valid); the first row sets the heads and dim the others must match, so a second
    row of other heads is the one refused, by its index. Seeded bug: the reference row ``layers[0]`` -> ``layers[1]``
    (one row cannot be padded; the wrong row blamed)."""
    generator = torch.Generator().manual_seed(7)
    keys, values = torch.randn(1, 2, 3, 4, generator=generator), torch.randn(1, 2, 3, 6, generator=generator)
    got_keys, got_values, valid = pad_layers([(keys, values, None)])
    assert torch.equal(got_keys, keys) and torch.equal(got_values, values) and bool(valid.all())
    other = torch.randn(1, 3, 5, 4, generator=generator)
    with pytest.raises(ValueError, match=r"^row 1: keys of shape \(1, 3, 5, 4\) do not match \(1, 2, n, 4\)$"):
        pad_layers([(keys, values, None), (other, torch.randn(1, 3, 5, 6), None)])


# ------------------------------------------------------------------------------------------------- shared prefix


def _direct_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix: SharedPrefix, scale: float
) -> torch.Tensor:
    """Each row's softmax attention over its own copy of the prefix (its values plus its delta row, if the row is one
    of the last ``len(value_delta)``) followed by its own tokens, causal; ``(batch, new, heads, dim)``, float64."""
    batch, heads, new, _ = query.shape
    kv_heads, length = prefix.keys.shape[1], prefix.keys.shape[2]
    delta_rows = 0 if prefix.value_delta is None else prefix.value_delta.shape[0]
    outputs = []
    for row in range(batch):
        values = prefix.values[0].double()
        if row >= batch - delta_rows:
            values = values + prefix.value_delta[row - (batch - delta_rows)].double()
        keys = torch.cat([prefix.keys[0].double(), key[row].double()], dim=1).repeat_interleave(heads // kv_heads, 0)
        vals = torch.cat([values, value[row].double()], dim=1).repeat_interleave(heads // kv_heads, 0)
        scores = query[row].double() @ keys.transpose(1, 2) * scale
        visible = torch.ones(new, length + new, dtype=torch.bool).tril(diagonal=length)
        outputs.append((scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vals).transpose(0, 1))
    return torch.stack(outputs)


@pytest.mark.parametrize("rows_per_chunk", [None, 2, 1], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("delta_rows", [0, 1, 2, 3])
def test_value_delta_rows_reach_the_last_batch_rows_in_any_chunking(
    rows_per_chunk: int | None, delta_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta row ``i`` is added to the values batch row ``batch - delta_rows + i`` sees, whether the batch runs in one
    chunk of rows or in chunks of 2 or 1 (the delta rows split across them): the output equals a direct computation.
    Seeded bugs: the delta slice starting at ``first + (batch - delta_rows)`` (the wrong rows, or none); the chunks'
    outputs joined only when there are more than 2 (two chunks return the first alone)."""
    generator = torch.Generator().manual_seed(8)
    batch, heads, kv_heads, new, length, dim = 3, 4, 2, 3, 7, 8
    if rows_per_chunk is not None:  # the row chunks of shared_prefix_attention: its score bytes per row
        monkeypatch.setattr(shared_prefix_module, "MAX_SCORE_BYTES", rows_per_chunk * heads * new * length * 4)
    query = torch.randn(batch, heads, new, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, new, dim, generator=generator) for _ in range(2))
    delta = torch.randn(delta_rows, kv_heads, length, dim, generator=generator) if delta_rows else None
    prefix = SharedPrefix(
        torch.randn(1, kv_heads, length, dim, generator=generator),
        torch.randn(1, kv_heads, length, dim, generator=generator),
        delta,
    )
    got = shared_prefix_attention(query, key, value, prefix, scaling=0.4)
    torch.testing.assert_close(got.double(), _direct_attention(query, key, value, prefix, 0.4), atol=1e-5, rtol=1e-5)


def _prefix_case(batch: int, length: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SharedPrefix]:
    """Query, new keys and values and a prefix (with a delta for the last row) of 4 heads over 2 KV heads, 3 new."""
    generator = torch.Generator().manual_seed(9)
    query = torch.randn(batch, 4, 3, dim, generator=generator)
    key, value = (torch.randn(batch, 2, 3, dim, generator=generator) for _ in range(2))
    keys, values, delta = (torch.randn(n, 2, length, dim, generator=generator) for n in (1, 1, 1))
    return query, key, value, SharedPrefix(keys, values, delta)


def test_without_the_fused_cpu_kernel_the_prefix_part_is_the_same_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch has no fused CPU kernel, the explicit softmax over the prefix gives the direct attention too.
    Seeded bugs: ``cpu and _FLASH_CPU is not None`` -> ``or`` (the missing kernel called); the log-sum-exp over
    ``dim=-2`` (the rows, not the prefix positions)."""
    query, key, value, prefix = _prefix_case(3, 7, 8)
    monkeypatch.setattr(shared_prefix_module, "_FLASH_CPU", None)
    got = shared_prefix_attention(query, key, value, prefix, scaling=0.4)
    torch.testing.assert_close(got.double(), _direct_attention(query, key, value, prefix, 0.4), atol=1e-5, rtol=1e-5)


def test_row_chunks_are_the_most_rows_whose_prefix_scores_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's prefix scores take ``heads * new * length * 4`` bytes: under a limit of 2.5 rows' bytes the 5 rows run
    as chunks of 2, 2 and 1 (the prefix length, not the head dim 8, sets a row's size), with the direct attention's
    output. Seeded bug: ``prefix.keys.shape[2]`` -> ``shape[3]`` (a row sized by its dim: chunks of 1 row at a
    4-token prefix, all 5 rows at once at a 16-token one)."""
    rows: list[int] = []
    attend = shared_prefix_module._attend

    def spy(query: torch.Tensor, *args: Any) -> torch.Tensor:
        rows.append(query.shape[0])
        return attend(query, *args)

    monkeypatch.setattr(shared_prefix_module, "_attend", spy)
    for length in (4, 16):
        rows.clear()
        query, key, value, prefix = _prefix_case(5, length, 8)
        monkeypatch.setattr(shared_prefix_module, "MAX_SCORE_BYTES", 4 * 3 * length * 4 * 5 // 2)
        got = shared_prefix_attention(query, key, value, prefix, scaling=0.4)
        assert rows == [2, 2, 1], length
        want = _direct_attention(query, key, value, prefix, 0.4)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
