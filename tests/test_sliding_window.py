"""Models with sliding-window layers (Gemma 3: local layers between global ones) at any prompt length.

Sliding layers are never compressed (as kvpress leaves Gemma 3's): they keep their whole cache and attend through
the model's own sliding mask, and the budget schedules spread the global budget over the global layers. Prompts
here are longer than the window (16 tokens), so a sliding layer that saw every cached key, or a window shifted by
one position, would change the tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvpress import SnapKVPress
from transformers import DynamicCache, Gemma3TextConfig, PreTrainedModel
from transformers.cache_utils import DynamicSlidingWindowLayer

from ripplekv.allocation.budget import BudgetSpec, ProfileSchedule
from ripplekv.inference.generate import extend, generate_answer, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.attention_masks import sliding_window_mask
from ripplekv.models.layer_types import NoGlobalLayersError, compressed_layers, sliding_layers
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.profiling.passes import can_share_prefix
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample
from ripplekv_eval.fastpath.batched import batched_teacher_forced_logprobs
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import decode_batch, random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

GEMMA_PROFILE = Path(__file__).parents[1] / "benchmarks/results/gemma3-270m/gemma3-270m.profile.json"

WINDOW = 16
LOCAL_FIRST = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]  # as Gemma 3
GLOBAL_FIRST = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
SCORES = (0.1, 2.0, 0.5, 1.2)


def _gemma(types: list[str] = LOCAL_FIRST, varlen: bool = True) -> PreTrainedModel:
    model = tiny_model("gemma3", layers=len(types), layer_types=types, sliding_window=WINDOW)
    return enable_varlen_attention(model) if varlen else model


def _ripple(budget: float = 0.5) -> RippleKVPress:
    return RippleKVPress(press=SnapKVPress(window_size=4), budget=budget, scores=SCORES)


class _Tokenizer:
    """Characters as token ids (0-255), enough for generate_answer without a chat template."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict:
        return {"input_ids": torch.tensor([[ord(c) % 256 for c in text]])}

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in tokens)


def test_layer_types() -> None:
    model = _gemma(GLOBAL_FIRST)
    assert sliding_layers(model.config) == (False, True, False, True)
    assert compressed_layers(model.config) == (0, 2)
    assert compressed_layers(tiny_model("llama").config) == (0, 1, 2, 3)
    with pytest.raises(NoGlobalLayersError, match="nothing to compress"):
        compressed_layers(_gemma(["sliding_attention"] * 2).config)


@pytest.mark.parametrize("types", [LOCAL_FIRST, GLOBAL_FIRST], ids=["local-first", "global-first"])
def test_full_cache_beyond_the_window_equals_transformers_generate(types: list[str]) -> None:
    """A 40-token prompt and 12 decoded tokens, window 16: the tokens of the model's own ``generate`` (its
    ``DynamicSlidingWindowLayer`` caches, stock sdpa), and a multi-token pass gives the model's own logits."""
    ids = random_ids(40, 3)
    reference = _gemma(types, varlen=False)
    with torch.no_grad():
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
        logits = reference(ids).logits[0, -1]
    model = _gemma(types)
    assert greedy_decode(model, prefill(model, ids), 12, set()) == out[0, 40:].tolist()
    for cache in (None, DynamicCache(config=model.config)):  # whole sliding layers, then window-truncated ones
        state = extend(model, prefill(model, ids[:, :22], cache=cache), ids[:, 22:])
        torch.testing.assert_close(state.next_logits, logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("types", [LOCAL_FIRST, GLOBAL_FIRST], ids=["local-first", "global-first"])
def test_compression_beyond_the_window_keeps_sliding_layers_whole(types: list[str]) -> None:
    """Global layers keep the RippleKV budgets of their own scores, which sum to the global total; sliding layers
    keep every token."""
    model, press, prompt = _gemma(types), _ripple(), 40
    state = prefill(model, random_ids(prompt, 4), press)
    kept = kept_tokens(state)
    layers = compressed_layers(model.config)
    assert kept == list(press.model_budgets(model.config, prompt))
    assert all(kept[i] == prompt for i in range(4) if i not in layers)
    assert sum(kept[i] for i in layers) == len(layers) * BudgetSpec(0.5).average(prompt) == 40
    global_scores = [SCORES[i] for i in layers]
    assert kept[layers[global_scores.index(max(global_scores))]] > kept[layers[global_scores.index(min(global_scores))]]
    assert len(greedy_decode(model, state, 12, set())) == 12


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "streamingllm", "adakv", "pyramidkv-kvpress"])
def test_every_method_leaves_sliding_layers_whole(name: str) -> None:
    model, prompt = _gemma(GLOBAL_FIRST), 48
    state = prefill(model, random_ids(prompt, 5), make_press(name, budget=0.5, window_size=4))
    kept = kept_tokens(state)
    assert kept[1] == kept[3] == prompt, kept
    assert kept[0] < prompt and kept[2] < prompt, kept
    assert len(greedy_decode(model, state, 6, set())) == 6


def test_compressed_passes_with_a_compressed_first_layer_use_the_models_sliding_mask() -> None:
    """Layer 0 compressed: transformers sizes every mask from it. Decoding and a multi-token pass over whole
    sliding layers (``DynamicLayer``) give what they give over transformers' own window-truncated sliding layers,
    whose masks transformers builds from their own sizes."""
    model, ids, tail = _gemma(GLOBAL_FIRST), random_ids(40, 6), random_ids(9, 7)
    whole = prefill(model, ids, _ripple())
    truncated = prefill(model, ids, _ripple(), cache=DynamicCache(config=model.config))
    assert isinstance(truncated.cache.layers[1], DynamicSlidingWindowLayer)
    assert kept_tokens(whole)[::2] == [layer.keys.shape[2] for layer in truncated.cache.layers[::2]]
    assert greedy_decode(model, whole, 12, set()) == greedy_decode(model, truncated, 12, set())
    close = {"rtol": 1e-5, "atol": 1e-5}  # the same keys attended, masked out in one and absent in the other
    torch.testing.assert_close(
        extend(model, whole, tail).next_logits, extend(model, truncated, tail).next_logits, **close
    )
    forced = [int(t) for t in tail[0]]
    torch.testing.assert_close(
        teacher_forced_logprobs(model, whole, forced), teacher_forced_logprobs(model, truncated, forced), **close
    )


def test_batched_decoding_and_teacher_forcing_beyond_the_window() -> None:
    """The ragged decoding and the padded teacher forcing of the evaluation serve sliding layers' windows too."""
    model, ids = _gemma(GLOBAL_FIRST), random_ids(40, 8)
    record = record_prefill(model, ids)
    presses = [make_press("full"), _ripple(0.3), make_press("snapkv", budget=0.5, window_size=4)]
    states = [derived_prefill(record, press)[0] for press in presses]
    alone = [greedy_decode(model, state, 10, set()) for state in states]
    assert decode_batch(model, states, 10, set()) == alone
    forced = alone[0]
    for got, state in zip(batched_teacher_forced_logprobs(model, states, forced), states):
        torch.testing.assert_close(got, teacher_forced_logprobs(model, state, forced), rtol=1e-4, atol=1e-4)


def test_generate_answer_beyond_the_window() -> None:
    model = _gemma()
    context = "".join(chr(97 + i % 26) for i in range(60))
    for protocol in ("question-aware", "query-agnostic"):
        result = generate_answer(model, _Tokenizer(), context, "why?", _ripple(), max_new_tokens=6, protocol=protocol)
        assert len(result.token_ids) == 6
        assert result.layer_tokens[0] == result.layer_tokens[2] > WINDOW  # sliding layers: the whole prompt
        assert result.layer_tokens[1] < result.layer_tokens[0]


def test_profiling_beyond_the_window_scores_every_layer() -> None:
    """Profiling a 40 + 8 token sample (window 16) scores every layer, sliding ones included, as the stock
    model's own attention does (the generic path: the shared-prefix fast path is exact within the window only)."""
    config = ProfilingConfig(alpha=0.5)
    plain = score_sample(_gemma(varlen=False), random_ids(40, 9), random_ids(8, 10), config)
    varlen = score_sample(_gemma(), random_ids(40, 9), random_ids(8, 10), config)
    assert len(plain.kl) == 4 and all(k > 0 for k in plain.kl)
    torch.testing.assert_close(torch.tensor(plain.kl), torch.tensor(varlen.kl), rtol=1e-4, atol=1e-9)


def test_sliding_window_mask_is_transformers_sliding_mask() -> None:
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    for past, new in ((0, 20), (30, 1), (30, 7), (10, 3)):
        want = sdpa_mask(
            batch_size=1,
            cache_position=torch.arange(past, past + new),
            kv_length=past + new,
            mask_function=sliding_window_causal_mask_function(WINDOW),
            allow_is_causal_skip=False,
        )
        got = sliding_window_mask(new, past + new, WINDOW)
        got = got if got is not None else torch.ones(1, 1, new, past + new, dtype=torch.bool).tril(past)
        assert torch.equal(got, want), (past, new)


def test_shared_prefix_fast_path_only_where_every_layer_sees_every_key() -> None:
    assert can_share_prefix(_gemma(), WINDOW) and not can_share_prefix(_gemma(), WINDOW + 1)
    assert can_share_prefix(_gemma(["full_attention"] * 2), 100)  # a window in the config, no sliding layer


def test_gemma3_profile_of_every_layer_allocates_over_the_global_layers() -> None:
    """The committed Gemma 3 270M profile (18 scores, one per layer) loads; budgets go to its 3 global layers."""
    profile = SensitivityProfile.load(GEMMA_PROFILE)
    config = Gemma3TextConfig(num_hidden_layers=profile.num_layers)  # Gemma 3's pattern: every 6th layer global
    layers = compressed_layers(config)
    assert layers == (5, 11, 17)
    press = RippleKVPress(SnapKVPress(window_size=64), budget=0.2, profile=profile)
    budgets = press.model_budgets(config, 4096)
    assert sum(budgets[i] for i in layers) == 3 * BudgetSpec(0.2).average(4096)
    assert all(budgets[i] == 4096 for i in range(18) if i not in layers)
    want = ProfileSchedule(0.2, tuple(profile.scores[i] for i in layers)).layer_budgets(3, 4096, 64)
    assert tuple(budgets[i] for i in layers) == want
