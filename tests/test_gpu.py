"""On a CUDA GPU (``pytest -m gpu``; skipped where torch sees none; ``benchmarks/gpu/check.sh`` runs them).

Tiny random Llamas (hidden 64, GQA 4/2 heads) on cuda in bfloat16 and float16 with sdpa (and flash_attention_2
where ``flash_attn`` imports): every method through ``generate_answer``, batched decoding of AdaKV and RippleKV
rows against sequential decoding, and bfloat16 profiling against float32.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from scipy.stats import spearmanr

from benchmarks.gpu.efficiency_gpu import synthetic_profile
from ripplekv.inference.generate import generate_answer, greedy_decode, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.registry import METHODS, make_press
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.damage_profile import ORACLE_METHOD
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from tests.conftest import VOCAB, decode_batch, random_ids, tiny_model
from tests.test_ada_press import _masked

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
HALF = (torch.bfloat16, torch.float16)
HALF_IDS = ("bfloat16", "float16")
GENERATION_METHODS = tuple(m for m in METHODS if m != ORACLE_METHOD)  # the oracle needs a measured damage profile
WINDOW = 16
LAYERS = 3
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


class CharTokenizer:
    """Characters as token ids (0-255): enough for generate_answer (no chat template) and profiling."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str | None = "pt") -> dict:
        ids = [ord(c) % VOCAB for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in tokens)


def cuda_model(dtype: torch.dtype, layers: int = LAYERS, seed: int = 0, attn: str = "sdpa"):
    model = tiny_model("llama", layers=layers, seed=seed).to(DEVICE, dtype)
    if attn != "sdpa":
        model.set_attn_implementation(attn)
    return model


def press_for(method: str, model, budget: float = 0.3):
    return make_press(method, budget=budget, profile=synthetic_profile(model), window_size=WINDOW)


@pytest.fixture(scope="module", params=HALF, ids=HALF_IDS)
def half_model(request: pytest.FixtureRequest):
    return cuda_model(request.param)


@pytest.mark.parametrize("protocol", ["question-aware", "query-agnostic"])
@pytest.mark.parametrize("method", GENERATION_METHODS)
def test_generate_answer_every_method_on_cuda(half_model, method: str, protocol: str) -> None:
    context = "".join(chr(97 + (7 * i) % 26) for i in range(300))
    press = None if method == "full" else press_for(method, half_model)
    result = generate_answer(
        half_model, CharTokenizer(), context, "what comes next?", press, max_new_tokens=8, protocol=protocol
    )
    torch.cuda.synchronize()
    assert len(result.token_ids) == 8
    assert all(0 <= t < VOCAB for t in result.token_ids)
    assert len(result.layer_tokens) == LAYERS
    compressed_prompt = 300 if protocol == "query-agnostic" else result.prompt_tokens
    if method == "full":
        assert result.layer_tokens == (compressed_prompt,) * LAYERS
    else:
        assert sum(result.layer_tokens) < 0.5 * LAYERS * compressed_prompt, result.layer_tokens


@pytest.mark.parametrize("method", GENERATION_METHODS)
def test_prefill_logits_finite_and_on_cuda(half_model, method: str) -> None:
    state = prefill(half_model, random_ids(200, seed=1), press_for(method, half_model))
    assert state.next_logits.device.type == DEVICE.type
    assert state.next_logits.dtype == half_model.dtype
    assert bool(torch.isfinite(state.next_logits).all())
    assert all(layer.keys.device.type == DEVICE.type for layer in state.cache.layers)


@pytest.mark.skipif(not HAS_FLASH_ATTN, reason="flash_attn is not installed: flash_attention_2 not tested")
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_flash_attention_2(dtype: torch.dtype) -> None:
    """Presses that keep every layer at one length decode under flash_attention_2; the per-layer ones say why not."""
    model = cuda_model(dtype, attn="flash_attention_2")
    ids = random_ids(200, seed=2)
    for method in ("full", "streamingllm", "snapkv", "adakv"):
        state = prefill(model, ids, press_for(method, model))
        assert len(greedy_decode(model, state, 8, set())) == 8, method
    for method in ("pyramidkv", "ripplekv"):
        with pytest.raises(ValueError, match="different numbers of tokens"):
            prefill(model, ids, press_for(method, model))


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_batched_decode_of_adakv_and_ripplekv_rows_equals_sequential(dtype: torch.dtype) -> None:
    """float32: token for token. bfloat16: a row may leave the sequential tokens only at a near-tie (rounding)."""
    model = enable_varlen_attention(cuda_model(dtype, seed=3))
    ids = random_ids(160, seed=5)
    configs = [("adakv", 0.2), ("adakv", 0.5), ("ripplekv", 0.3), ("ripplekv-ada", 0.3), ("snapkv", 0.3)]
    states = [prefill(model, ids, press_for(method, model, budget)) for method, budget in configs]
    states.append(prefill(model, ids))  # full
    assert sum(bool(_masked(s)) for s in states) >= 2, "AdaKV's head-wise masks should be among the rows"
    assert len({tuple(layer.keys.shape[2] for layer in s.cache.layers) for s in states}) > 2
    stops = {7, 11, 200}
    sequential = [greedy_decode(model, s, 12, stops, min_new_tokens=1) for s in states]
    batched = decode_batch(model, states, 12, stops, min_new_tokens=1)
    torch.cuda.synchronize()
    if dtype == torch.float32:
        assert batched == sequential
        return
    for state, want, got in zip(states, sequential, batched):
        at = _first_divergence(want, got)
        if at is None:
            continue
        logprobs = teacher_forced_logprobs(model, state, want[: at + 1])[at]
        top2 = torch.topk(logprobs, 2).values
        assert float(top2[0] - top2[1]) < 0.5, (at, want, got, top2)


def test_bfloat16_profile_ranks_layers_like_float32() -> None:
    samples = tuple(
        CalibrationSample(
            context=f"sample {i}: " + "the quick brown fox jumps over the lazy dog. " * 4,
            continuation=f"and then {i} more words follow here",
        )
        for i in range(2)
    )
    calibration = CalibrationSet(samples=samples, description="synthetic")
    config = ProfilingConfig(alpha=0.5, repeats=2)
    model = cuda_model(torch.float32, layers=8)
    full = profile_model(model, CharTokenizer(), calibration, config)
    half = profile_model(model.to(torch.bfloat16), CharTokenizer(), calibration, config)
    rho = spearmanr(full.scores, half.scores).statistic
    assert rho >= 0.9, (rho, full.scores, half.scores)
    assert all(s > 0 for s in half.scores)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_prescored_expected_attention_on_cuda(dtype: torch.dtype) -> None:
    """ExpectedAttention prescored by a chunked record in half precision on cuda: the pinned scores live on the
    device and agree with kvpress's one-pass scores (on every hidden state) to the dtype's rounding."""
    from kvpress import ExpectedAttentionPress

    from ripplekv_eval.fastpath.record import record_prefill
    from ripplekv_eval.fastpath.score_memo import scorer_key

    model = cuda_model(dtype)
    ids = random_ids(300, seed=4).to(DEVICE)
    scorer = ExpectedAttentionPress()
    reference = record_prefill(model, ids, None, prefill_chunk=None)
    record = record_prefill(model, ids, WINDOW + 1, prefill_chunk=64, prescore=(scorer,))
    assert record.hidden_tokens == WINDOW + 1
    for index, layer in enumerate(reference.layers):
        want = scorer.score(layer.module, layer.hidden_states, layer.keys, layer.values, None, {})
        got = record.memo.get("scores", scorer_key(scorer), index, record.layers[index].keys, lambda: None)
        assert got.device.type == "cuda" and got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=5e-2)
