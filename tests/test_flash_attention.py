"""A model loaded with FlashAttention-2 is kept as loaded, and works with every press, generate, eval and profile.

flash-attn needs a CUDA GPU, so on the CPU its attention function is replaced (pytest ``monkeypatch``, these tests
only) by a stand-in computing what ``transformers.integrations.flash_attention.flash_attention_forward`` computes
for an unpadded batch: bottom-right aligned causal attention over whatever keys the layer holds (flash-attn >=
2.1), grouped-query heads, no dense mask (it fails on one), unknown keyword arguments ignored as FlashAttention
ignores them. The stand-in is wrapped by kvpress's ``attention_patch`` as kvpress wraps every registered attention
function at import, so AdaKV's head-wise masks run as they do under the real one. transformers' own mask function
for ``flash_attention_2`` is kept (pure Python: ``None`` for an unpadded batch).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from kvpress import SnapKVPress
from kvpress.attention_patch import attention_patch
from torch.nn.attention.bias import causal_lower_right
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ripplekv.inference.generate import generate_answer, greedy_decode, prefill
from ripplekv.models import loading
from ripplekv.models.attention import (
    HeadwiseMaskError,
    enable_varlen_attention,
    supports_per_layer_lengths,
    uses_varlen_attention,
    varlen_name,
)
from ripplekv.models.cache import fork_cache
from ripplekv.models.headwise import MASKED_KEYS, attention_modules, headwise_of
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.profiling import passes, sensitivity
from ripplekv.profiling.passes import can_share_prefix
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample
from ripplekv_eval.fastpath.batched import NotBatchableError, batched_teacher_forced_logprobs
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.running.runner import build_presses
from ripplekv_eval.sample import EvalSample
from tests.conftest import decode_batch, random_ids, synthetic_profile, tiny_model
from tests.test_device import _Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

FLASH = "flash_attention_2"
SCORES = (0.5, 3.0, 0.1, 1.2)  # a non-uniform RippleKV schedule over 4 layers
WINDOW = 8


def _flash_standin(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """FlashAttention-2 of an unpadded batch on the CPU (see the module docstring)."""
    if attention_mask is not None:
        raise AssertionError(f"FlashAttention got a dense mask of shape {tuple(attention_mask.shape)}")
    _flash_standin.calls += 1  # type: ignore[attr-defined]
    causal = module.is_causal if is_causal is None else is_causal
    mask = causal_lower_right(query.shape[2], key.shape[2]) if causal and query.shape[2] > 1 else None
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def flash(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install the stand-in for ``flash_attention_2``; returns a function loading a tiny model with it."""
    _flash_standin.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, FLASH, attention_patch(_flash_standin))

    def load(arch: str = "llama", layers: int = 4, seed: int = 0) -> Any:
        model = tiny_model(arch, layers=layers, seed=seed)
        # what from_pretrained(attn_implementation="flash_attention_2") sets (it checks that flash_attn imports)
        model.config._attn_implementation = FLASH
        return model

    return load


def _per_layer_presses(model: Any) -> dict[str, Any]:
    profile = synthetic_profile(model)
    return {
        "ripplekv": RippleKVPress(SnapKVPress(window_size=WINDOW), budget=0.3, scores=SCORES),
        "pyramidkv": make_press("pyramidkv", budget=0.3, window_size=WINDOW),
        "adakv": make_press("adakv", budget=0.3, window_size=WINDOW),
        "ripplekv-ada": make_press("ripplekv-ada", budget=0.3, profile=profile, window_size=WINDOW),
        "streamingllm": make_press("streamingllm", budget=0.3),
    }


def test_flash_attention_is_kept_by_enable_and_the_presses(flash: Any) -> None:
    model = flash()
    assert supports_per_layer_lengths(model) and not uses_varlen_attention(model)
    assert enable_varlen_attention(model) is model and model.config._attn_implementation == FLASH
    for name, press in _per_layer_presses(model).items():
        press.post_init_from_model(model)
        assert model.config._attn_implementation == FLASH, name
    with pytest.raises(ValueError, match="has no ripplekv variant"):
        varlen_name(FLASH)
    stock = tiny_model("llama", layers=4)
    assert not supports_per_layer_lengths(stock)
    _per_layer_presses(stock)["ripplekv"].post_init_from_model(stock)
    assert stock.config._attn_implementation == "ripplekv_sdpa"  # sdpa is still switched
    stock.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="'sdpa', 'eager', 'flash_attention_2'"):
        enable_varlen_attention(stock)


def test_load_model_keeps_flash_attention(flash: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    tiny_model("llama", layers=2).save_pretrained(tmp_path)
    real = loading.AutoModelForCausalLM
    requested: list[str] = []

    class FlashLoader:  # from_pretrained checks that flash_attn imports; the rest of load_model runs as is
        @staticmethod
        def from_pretrained(path: str, dtype: torch.dtype, attn_implementation: str) -> Any:
            requested.append(attn_implementation)
            model = real.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
            model.config._attn_implementation = attn_implementation
            return model

    class Tokenizer:
        pad_token_id = eos_token_id = None

        @staticmethod
        def from_pretrained(path: str) -> Tokenizer:
            return Tokenizer()

    monkeypatch.setattr(loading, "AutoModelForCausalLM", FlashLoader)
    monkeypatch.setattr(loading, "AutoTokenizer", Tokenizer)
    model, _ = loading.load_model(str(tmp_path), device="cpu", attn_implementation=FLASH)
    assert requested == [FLASH] and model.config._attn_implementation == FLASH
    model, _ = loading.load_model(str(tmp_path), device="cpu", attn_implementation="sdpa")
    assert model.config._attn_implementation == "ripplekv_sdpa"


def test_generate_under_flash_attention_equals_ripplekv_sdpa(flash: Any) -> None:
    model = flash()
    reference = enable_varlen_attention(tiny_model("llama", layers=4))
    context = "".join(chr(97 + (7 * i) % 26) for i in range(120))
    for name in ("ripplekv", "pyramidkv", "adakv", "ripplekv-ada"):
        for protocol in ("question-aware", "query-agnostic"):
            calls = _flash_standin.calls  # type: ignore[attr-defined]
            press = _per_layer_presses(model)[name]
            ours = generate_answer(model, _Tokenizer(), context, "why?", press, max_new_tokens=8, protocol=protocol)
            assert _flash_standin.calls > calls and model.config._attn_implementation == FLASH  # type: ignore[attr-defined]
            press = _per_layer_presses(reference)[name]
            theirs = generate_answer(reference, _Tokenizer(), context, "why?", press, 8, protocol=protocol)
            assert ours.token_ids == theirs.token_ids, (name, protocol)
            assert ours.layer_tokens == theirs.layer_tokens
            if name in ("ripplekv", "pyramidkv"):
                assert len(set(ours.layer_tokens)) > 1, "the schedule should give layers different budgets"


def test_flash_attention_gets_the_cache_layers_masks_for_each_pass_only(flash: Any) -> None:
    """Under FlashAttention the masks a cache layer holds reach kvpress's wrapper through the attention modules for
    one pass and are removed after it; modules holding masks already are a clear error. Seeded bug caught: the masks
    left on the modules after the pass."""
    model = flash()
    press = _per_layer_presses(model)["adakv"]
    state = derived_prefill(record_prefill(model, random_ids(96, seed=5)), press)[0]
    seen: list[bool] = []
    modules = attention_modules(model)
    look = lambda module, args: seen.append(getattr(module, MASKED_KEYS, None) is not None)  # noqa: E731
    handles = [module.register_forward_pre_hook(look) for module in modules]
    try:
        greedy_decode(model, state, 3, set())
    finally:
        for handle in handles:
            handle.remove()
    assert len(seen) == 2 * len(modules) and all(seen)
    assert all(MASKED_KEYS not in vars(module) for module in modules)
    setattr(modules[1], MASKED_KEYS, headwise_of(state.cache.layers[1]).indices)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"layer\(s\) \[1\] hold head-wise masks already"):
        greedy_decode(model, state, 3, set())
    del modules[1].masked_key_indices


@pytest.mark.parametrize("method", ["adakv", "ripplekv-ada"])
def test_a_plain_pass_over_a_masked_cache_under_flash_attention_names_cache_forward(flash: Any, method: str) -> None:
    """FlashAttention reads a cache's head-wise masks only through ``cache_forward`` (kvpress's fake keys): a plain
    ``model(...)`` over the cache raises naming it instead of attending to the masked entries."""
    model = flash()
    state = prefill(model, random_ids(96, seed=5), _per_layer_presses(model)[method])
    assert any(headwise_of(layer) is not None for layer in state.cache.layers)
    position = torch.tensor([state.prompt_tokens])
    with pytest.raises(HeadwiseMaskError, match="cache_forward"), torch.no_grad():
        model(torch.tensor([[3]]), past_key_values=fork_cache(state.cache), cache_position=position)
    assert len(greedy_decode(model, state, 3, set())) == 3  # through cache_forward


def _states(model: Any) -> list[Any]:
    record = record_prefill(model, random_ids(96, seed=5))
    presses = _per_layer_presses(model)
    return [derived_prefill(record, presses[name])[0] for name in ("ripplekv", "pyramidkv", "adakv")]


def test_batched_decoding_under_flash_attention_falls_back(flash: Any) -> None:
    model = flash(layers=4, seed=3)
    reference = enable_varlen_attention(tiny_model("llama", layers=4, seed=3))
    states, reference_states = _states(model), _states(reference)
    with pytest.raises(NotBatchableError, match="attn_implementation='sdpa'"):
        decode_batch(model, states, 6, {7})
    sequential = [greedy_decode(model, state, 6, {7}) for state in states]
    assert sequential == decode_batch(reference, reference_states, 6, {7})
    # batched teacher forcing teacher-forces one cache at a time under it: the same log-probabilities
    forced = batched_teacher_forced_logprobs(model, states, [3, 5, 8, 13])
    for state, logprobs, other in zip(
        states, forced, batched_teacher_forced_logprobs(reference, reference_states, [3, 5, 8, 13])
    ):
        torch.testing.assert_close(logprobs, teacher_forced_logprobs(model, state, [3, 5, 8, 13]), atol=0, rtol=0)
        torch.testing.assert_close(logprobs, other, atol=1e-4, rtol=1e-4)


def test_eval_rows_under_flash_attention_decode_one_at_a_time(flash: Any) -> None:
    """rows.py's batched decoding catches the NotBatchableError and decodes each cache alone: same rows."""
    model = flash(layers=4, seed=3)
    reference = enable_varlen_attention(tiny_model("llama", layers=4, seed=3))
    config = EvalConfig(
        suite="needle",
        methods=("full", "snapkv", "pyramidkv", "adakv", "streamingllm"),
        budgets=(0.3,),
        window_size=WINDOW,
        max_new_tokens=5,
        decode="batched",
    )
    ids = tuple(int(t) for t in random_ids(90, seed=9)[0])
    sample = EvalSample(id="s0", task="t", input_ids=ids, question_start=80, max_new_tokens=5, score=lambda p: 0.0)
    pending = [("full", 1.0)] + [(m, 0.3) for m in config.methods if m != "full"]
    rows = {}
    for which, net in (("flash", model), ("sdpa", reference)):
        presses = build_presses(config, None, net)
        rows[which] = {
            r["method"]: r for r in SampleRunner(config, net, _Tokenizer(), presses).run_sample(sample, pending)
        }
    assert model.config._attn_implementation == FLASH
    for method, row in rows["flash"].items():
        other = rows["sdpa"][method]
        assert row["prediction"] == other["prediction"] and row["kept_tokens"] == other["kept_tokens"], method
        assert math.isclose(row["fidelity_kl"], other["fidelity_kl"], rel_tol=1e-3, abs_tol=1e-6), method
        if method != "full":
            assert row["decode_rows"] == 1 and other["decode_rows"] > 1, method


def test_profiling_under_flash_attention_takes_the_generic_path(flash: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model = flash(layers=4)
    fast_model = enable_varlen_attention(tiny_model("llama", layers=4))
    ctx, cont = random_ids(50, 3), random_ids(7, 4)
    config = ProfilingConfig(alpha=0.6, repeats=2, seed=2)
    assert not can_share_prefix(model, 57) and can_share_prefix(fast_model, 57)
    fast = score_sample(fast_model, ctx, cont, config, sample_index=1)  # batched_by_depth

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the shared-prefix path cannot run under FlashAttention")

    monkeypatch.setattr(sensitivity, "batched_by_depth", refuse)
    calls = _flash_standin.calls  # type: ignore[attr-defined]
    generic = score_sample(model, ctx, cont, config, sample_index=1)  # layer_by_layer
    assert _flash_standin.calls > calls and passes.layer_by_layer is sensitivity.layer_by_layer  # type: ignore[attr-defined]
    for a, b in zip(generic.kl + generic.local, fast.kl + fast.local):
        assert math.isclose(a, b, rel_tol=2e-4, abs_tol=1e-7), (generic, fast)


def test_analyze_and_tune_rows_under_flash_attention(flash: Any) -> None:
    """``ripplekv analyze`` (single-layer damage) and ``ripplekv tune`` (batched teacher forcing) keep it and agree."""
    from ripplekv_eval.analysis.damage import DamageRunner
    from ripplekv_eval.analysis.tuning import TuneConfig, TuneRunner

    model = flash(layers=4, seed=3)
    reference = enable_varlen_attention(tiny_model("llama", layers=4, seed=3))
    config = EvalConfig(suite="needle", methods=("snapkv",), budgets=(0.3,), window_size=WINDOW, max_new_tokens=4)
    ids = tuple(int(t) for t in random_ids(90, seed=9)[0])
    sample = EvalSample(id="s0", task="t", input_ids=ids, question_start=80, max_new_tokens=4, score=lambda p: 0.0)
    tune = TuneConfig(eval=config, profiles={"p": "unused.json"}, ratios=(2.0,), gammas=(2.0,))
    rows: dict[str, list[dict[str, Any]]] = {}
    for which, net in (("flash", model), ("sdpa", reference)):
        damage = list(DamageRunner(config, net, _Tokenizer()).run_sample(sample, [0.3]))
        tuned = list(TuneRunner(tune, {"p": synthetic_profile(net)}, net, _Tokenizer()).run_sample(sample, [0.3]))
        rows[which] = damage + tuned
    assert model.config._attn_implementation == FLASH
    for ours, theirs in zip(rows["flash"], rows["sdpa"]):
        assert ours.get("answer_ids") == theirs.get("answer_ids")
        assert {"damage_kl", "uniform_kl", "kl", "snapkv_kl"} <= {key for row in rows["flash"] for key in row}
        for key in ("damage_kl", "uniform_kl", "kl", "snapkv_kl"):
            if key in ours:
                torch.testing.assert_close(
                    torch.tensor(_numbers(ours[key])), torch.tensor(_numbers(theirs[key])), rtol=1e-3, atol=1e-6
                )


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [float(value[k]) for k in sorted(value)]
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return [float(value)]
