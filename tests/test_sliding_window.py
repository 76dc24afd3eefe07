"""Models with sliding-window layers (Gemma 3: 5 local layers per global one): exact within the window, refused
beyond it."""

from __future__ import annotations

import pytest
import torch
from kvpress import SnapKVPress
from transformers import PreTrainedModel

from ripplekv.inference import greedy_decode, prefill
from ripplekv.models.attention import SlidingWindowError, check_within_window, enable_varlen_attention
from ripplekv.presses import RippleKVPress
from ripplekv.profiling import ProfilingConfig, score_sample
from tests.conftest import random_ids, tiny_model

WINDOW = 48


def _gemma() -> PreTrainedModel:
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    return tiny_model("gemma3", layers=4, layer_types=types, sliding_window=WINDOW)


def test_within_the_window_ripplekv_attention_equals_the_model() -> None:
    """Uncompressed, the variable-length attention over a 40-token prompt and 8 decoded tokens gives the tokens of
    the model's own generate (sliding masks, per-type RoPE)."""
    ids = random_ids(40, 3)
    reference = _gemma()
    with torch.no_grad():
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    model = enable_varlen_attention(_gemma())
    assert greedy_decode(model, prefill(model, ids), 8, set()) == out[0, 40:].tolist()


def test_compression_within_the_window_runs_and_beyond_it_is_refused() -> None:
    model = enable_varlen_attention(_gemma())
    press = RippleKVPress(press=SnapKVPress(window_size=4), budget=0.5, scores=(0.1, 2.0, 0.5, 1.2))
    # 9 decoded tokens: the model runs on positions 0-47 (the last token decoded is never fed back)
    assert len(greedy_decode(model, prefill(model, random_ids(40, 4), press), 9, set())) == 9
    with pytest.raises(SlidingWindowError, match=f"last {WINDOW} tokens.*has 49 tokens"):
        greedy_decode(model, prefill(model, random_ids(40, 4), press), 10, set())
    with pytest.raises(SlidingWindowError, match="sliding-window layers"):
        prefill(model, random_ids(WINDOW + 1, 5), press)


def test_profiling_within_the_window_scores_every_layer() -> None:
    """Profiling within the window: the model's own sliding masks and ripplekv's attention give the same scores."""
    config = ProfilingConfig(alpha=0.5)
    plain = score_sample(_gemma(), random_ids(32, 6), random_ids(8, 7), config)
    varlen = score_sample(enable_varlen_attention(_gemma()), random_ids(32, 6), random_ids(8, 7), config)
    assert len(plain.kl) == 4 and all(k > 0 for k in plain.kl)
    torch.testing.assert_close(torch.tensor(plain.kl), torch.tensor(varlen.kl), rtol=1e-4, atol=1e-9)


def test_check_within_window() -> None:
    check_within_window(torch.arange(10, 20), 20)
    check_within_window(torch.arange(0, 500), None)
    with pytest.raises(SlidingWindowError, match="has 21 tokens"):
        check_within_window(torch.arange(10, 21), 20)
