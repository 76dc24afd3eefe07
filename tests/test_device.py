"""Device placement: every tensor the library makes lives where the tensors it is combined with live.

Most machines that run these tests have no GPU, so device bugs are caught on the CPU in two ways:

* the ``meta`` device: masks, attention and noise run over ``meta`` tensors; a tensor made on the CPU then fails
  to combine with them, or comes back on the CPU;
* :class:`DeviceSpy`, a ``TorchFunctionMode`` that records, during whole CPU flows (batched decoding with AdaKV
  rows, generation, teacher forcing, profiling), every tensor factory called from ``src/ripplekv`` without a
  ``device`` and every copy of a tensor to another device made from there.

The tests marked ``gpu`` run the same flows on CUDA (skipped without a GPU, see ``tests/conftest.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import ripplekv
from ripplekv.inference.generate import Prefill, cache_forward, extend, generate_answer, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.attention_functions import CACHE_KWARG
from ripplekv.models.attention_masks import fit_attention_mask
from ripplekv.models.cache import cache_from_layers
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.profiling.noise import noise_generator, norm_adaptive_noise
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample
from ripplekv_eval.fastpath.batched import batched_teacher_forced_logprobs
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.padded import KeyValidity, RaggedLayer
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import decode_batch, random_ids, synthetic_profile, tiny_model
from tests.test_ada_press import _masked

pytestmark = pytest.mark.usefixtures("one_thread")

META = torch.device("meta")
SRC = str(Path(ripplekv.__file__).resolve().parents[1])  # src/: the library and the harness
TORCH = str(Path(torch.__file__).resolve().parent)
SCORES = (0.5, 3.0, 0.1, 1.2)
FACTORIES = {
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.tensor,
    torch.as_tensor,
    torch.randn,
    torch.rand,
    torch.randint,
    torch.eye,
}

HOST_READS = {
    torch.Tensor.__int__,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.nonzero,
    torch.nonzero,
}


def _caller() -> str | None:
    """``file:function:line`` of the library code that called the intercepted torch function, else None.

    Only the direct caller counts: a factory called by torch's own Python code (a causal bias materialising itself
    on the queries' device) is torch's doing, not the library's.
    """
    frame = sys._getframe(2)  # 0: here, 1: DeviceSpy.__torch_function__, 2: the caller of the torch function
    name = frame.f_code.co_filename
    if not name.startswith(SRC):
        return None
    return f"{Path(name).relative_to(SRC)}:{frame.f_code.co_name}:{frame.f_lineno}"


def _target(func: Callable, args: tuple, kwargs: dict[str, Any]) -> torch.device | None:
    """Where ``Tensor.to`` / ``.cpu`` / ``.cuda`` sends its tensor (None: the same device)."""
    if func is torch.Tensor.cpu:
        return torch.device("cpu")
    if func is torch.Tensor.cuda:
        return torch.device("cuda")
    device, _, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
    return device


class DeviceSpy(TorchFunctionMode):
    """Records factories without a device, and copies across devices, made by library code (see the module).

    Args:
        copies_allowed: ``file:function`` of library functions whose copies across devices are by design.
    """

    def __init__(self, copies_allowed: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.copies_allowed = copies_allowed
        self.violations: list[str] = []
        self.host_reads: list[str] = []  # library code reading a tensor's value on the host (a device sync)

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in HOST_READS:
            where = _caller()
            if where is not None:
                self.host_reads.append(f"{where}: {func.__name__}")
        elif func in FACTORIES and kwargs.get("device") is None:
            where = _caller()
            if where is not None:
                self.violations.append(f"{where}: torch.{func.__name__} without a device")
        elif func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda) and isinstance(args[0], torch.Tensor):
            target = _target(func, args, kwargs)
            if target is not None and torch.device(target).type != args[0].device.type:
                where = _caller()
                if where is not None and where.rsplit(":", 1)[0] not in self.copies_allowed:
                    self.violations.append(f"{where}: copies a tensor from {args[0].device} to {target}")
        return func(*args, **kwargs)


# The one copy across devices by design: the noise draw of a CPU generator (profiles do not depend on the device).
NOISE_DRAW = "ripplekv/profiling/noise.py:norm_adaptive_noise"


@contextmanager
def no_device_violations(copies_allowed: frozenset[str] = frozenset({NOISE_DRAW})) -> Iterator[DeviceSpy]:
    spy = DeviceSpy(copies_allowed)
    with spy:
        yield spy
    assert not spy.violations, "\n".join(sorted(set(spy.violations)))


# ------------------------------------------------------------------------------------------------ meta device


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


def test_ragged_layer_masks_are_made_on_the_keys_device() -> None:
    valid = _meta(2, 6, dtype=torch.bool)
    layer = RaggedLayer(
        [(_meta(1, 2, 10, 16), _meta(1, 2, 10, 16), None), (_meta(1, 2, 6, 16), _meta(1, 2, 6, 16), valid)], 4
    )
    layer.update(_meta(2, 2, 3, 16), _meta(2, 2, 3, 16))
    with no_device_violations():
        for row, length in ((0, 13), (1, 9)):
            mask = layer.row_mask(row, 3, heads=4)
            assert mask.device == META and mask.shape == (1, 4, 3, length) and mask.dtype == torch.bool
        assert layer.row_mask(1, 1, heads=4).device == META  # a decoding step over head-wise masked entries


def test_key_validity_and_fitted_masks_are_made_on_the_given_device() -> None:
    validity = KeyValidity((_meta(2, 2, 7, dtype=torch.bool),) * 2)
    with no_device_violations():
        mask = validity.mask(1, query_len=3, key_len=10, heads=4)
        assert mask.device == META and mask.shape == (2, 4, 3, 10)
        for additive in (False, True):
            built = fit_attention_mask(None, 3, 8, additive=additive, dtype=torch.bfloat16, device=META)
            assert built.device == META and built.shape == (1, 1, 3, 8)
            assert built.dtype == (torch.bfloat16 if additive else torch.bool)
            fitted = fit_attention_mask(fit_attention_mask(None, 3, 12, additive, device=META), 3, 8, additive)
            assert fitted.device == META and fitted.shape == (1, 1, 3, 8)


def test_noise_is_computed_on_the_values_device() -> None:
    values = _meta(3, 2, 20, 16, dtype=torch.bfloat16)
    spy = DeviceSpy()
    with spy:
        noise = norm_adaptive_noise(values, 0.5, noise_generator(1, 2, 3))
    assert noise.device == META and noise.dtype == torch.bfloat16 and noise.shape == values.shape
    # the draw is made by the CPU generator (device-independent profiles) and copied once; nothing else moves
    assert [v.split(": ", 1)[1] for v in spy.violations] == ["copies a tensor from cpu to meta"], spy.violations


@pytest.mark.parametrize("name", ["ripplekv_sdpa", "ripplekv_eager"])
def test_varlen_attention_runs_on_the_queries_device(name: str) -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    module = model.model.layers[1].self_attn
    attention = ALL_ATTENTION_FUNCTIONS[name]
    query, key = _meta(2, 4, 3, 16), _meta(2, 2, 10, 16)
    validity = KeyValidity((_meta(2, 2, 7, dtype=torch.bool),) * 2)
    with no_device_violations():
        for kwargs in ({}, {"key_validity": validity}):  # a causal offset over a longer layer; a padded batch
            out, _ = attention(module, query, key, key, None, scaling=0.25, dropout=0.0, **kwargs)
            assert out.device == META and out.shape == (2, 3, 4, 16)
        valid = _meta(2, 6, dtype=torch.bool)
        rows = [(_meta(1, 2, 10, 16), _meta(1, 2, 10, 16), None), (_meta(1, 2, 6, 16), _meta(1, 2, 6, 16), valid)]
        ragged = cache_from_layers([RaggedLayer(rows, 4) for _ in range(2)])
        for layer in ragged.layers:
            layer.update(_meta(2, 2, 1, 16), _meta(2, 2, 1, 16))
        out, _ = attention(module, _meta(2, 4, 1, 16), None, None, None, scaling=0.25, **{CACHE_KWARG: ragged})
        assert out.device == META and out.shape == (2, 1, 4, 16)


# ------------------------------------------------------------------------------------------- whole CPU flows


def _states(model: Any, methods: tuple[str, ...] = ("adakv", "ripplekv-ada", "ripplekv", "pyramidkv")) -> list[Prefill]:
    record = record_prefill(model, random_ids(96, seed=5).to(next(model.parameters()).device))
    profile = synthetic_profile(model)
    return [derived_prefill(record, make_press(m, budget=0.3, profile=profile, window_size=8))[0] for m in methods]


class _Tokenizer:
    """Characters as token ids (0-255), enough for generate_answer without a chat template."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict:
        return {"input_ids": torch.tensor([[ord(c) % 256 for c in text]])}

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in tokens)


def test_batched_decoding_and_teacher_forcing_make_no_tensor_off_device() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=3, seed=3))
    states = _states(model)
    assert any(map(_masked, states)), "AdaKV rows (head-wise masks) should be among them"
    with no_device_violations():
        batched = decode_batch(model, states, 6, {7}, min_new_tokens=1)
        sequential = [greedy_decode(model, state, 6, {7}, min_new_tokens=1) for state in states]
        together = batched_teacher_forced_logprobs(model, states, [3, 5, 8, 13])
        alone = [teacher_forced_logprobs(model, state, [3, 5, 8, 13]) for state in states]
    assert batched == sequential
    for a, b in zip(together, alone):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_generation_and_profiling_make_no_tensor_off_device() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=4))
    context = "".join(chr(97 + i % 26) for i in range(90))
    presses = [make_press("adakv", budget=0.3, window_size=8), RippleKVPress(budget=0.3, scores=SCORES)]
    config = ProfilingConfig(alpha=0.5, repeats=2, seed=1)
    with no_device_violations():
        for press in presses:
            for protocol in ("question-aware", "query-agnostic"):
                result = generate_answer(
                    model, _Tokenizer(), context, "why?", press, max_new_tokens=4, protocol=protocol
                )
                assert len(result.token_ids) == 4
        fast = score_sample(model, random_ids(40, 1), random_ids(5, 2), config, sample_index=0)
        generic = score_sample(tiny_model("llama", layers=4), random_ids(40, 1), None, config, sample_index=0)
    assert len(fast.kl) == len(generic.kl) == 4


def test_passes_over_compressed_caches_do_not_synchronise_with_the_host() -> None:
    """A decoding step or a multi-token pass reads nothing back from the device in library code.

    Covers the mask function (no ``int(cache_position[0])``, no ``padding.all()`` on unpadded passes), the fitted
    causal offset, the head-wise masks of an AdaKV cache (validated once, when its layer is made, not per layer and
    pass) and the ragged batched step.
    """
    from ripplekv.models.cache import fork_cache
    from ripplekv_eval.fastpath.batched import decode_row, ragged_cache_of

    model = enable_varlen_attention(tiny_model("llama", layers=3, seed=3))
    states = _states(model)
    position = states[0].prompt_tokens
    for state in states:
        cache = fork_cache(state.cache)
        for ids in (torch.tensor([[5]]), torch.tensor([[6, 7, 8]])):
            positions = torch.arange(position, position + ids.shape[1])
            spy = DeviceSpy()
            with spy, torch.no_grad():
                cache_forward(model, ids, cache, positions)
            assert not spy.host_reads and not spy.violations, spy.host_reads + spy.violations
        assert cache.layers[0].get_seq_length() == state.cache.layers[0].get_seq_length() + 4
    ragged = ragged_cache_of([decode_row(state, 2) for state in states])
    step = torch.tensor([position])
    spy = DeviceSpy()
    with spy, torch.no_grad():
        cache_forward(model, torch.tensor([[5]] * len(states)), ragged, step)
    assert not spy.host_reads and not spy.violations, spy.host_reads + spy.violations


def test_the_spy_catches_a_factory_without_device() -> None:
    """The spy itself: a library-side factory without a device is reported (here: the mask of a ragged row)."""
    spy = DeviceSpy()
    layer = RaggedLayer([(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), None)], 2)
    layer.update(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    with spy:
        layer.row_mask(0, 2, heads=2)
        torch.arange(3)  # made by the test, not the library: not reported
    assert not spy.violations
    source = Path(SRC) / "ripplekv" / "models" / "padded.py"  # a function whose code claims to live in the library
    code = compile("import torch\ndef make(n):\n    return torch.arange(n)\n", str(source), "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    with spy:
        namespace["make"](3)
    assert spy.violations and "torch.arange without a device" in spy.violations[0]


# ------------------------------------------------------------------------------------------------------- GPU


HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
CUDA = torch.device("cuda")


def _cuda_model(dtype: torch.dtype, attn: str = "sdpa", layers: int = 3, seed: int = 3) -> Any:
    model = tiny_model("llama", layers=layers, seed=seed, attn="sdpa").to(device=CUDA, dtype=dtype)
    if attn == "flash_attention_2":
        model.set_attn_implementation("flash_attention_2")
        return model
    return enable_varlen_attention(model)


@pytest.mark.gpu
def test_gpu_batched_decoding_with_adakv_and_ripplekv_rows() -> None:
    model = _cuda_model(torch.float32)
    states = _states(model)
    assert all(state.cache.layers[0].keys.device.type == "cuda" for state in states)
    sequential = [greedy_decode(model, state, 8, {7}, min_new_tokens=1) for state in states]
    assert decode_batch(model, states, 8, {7}, min_new_tokens=1) == sequential
    together = batched_teacher_forced_logprobs(model, states, [3, 5, 8, 13])
    for state, logprobs in zip(states, together):
        torch.testing.assert_close(logprobs, teacher_forced_logprobs(model, state, [3, 5, 8, 13]), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "attn",
    [
        "sdpa",
        pytest.param(
            "flash_attention_2", marks=pytest.mark.skipif(not HAS_FLASH_ATTN, reason="flash_attn is not installed")
        ),
    ],
)
def test_gpu_generate_in_half_precision(dtype: torch.dtype, attn: str) -> None:
    model = _cuda_model(dtype, attn, layers=4, seed=0)
    expected = "flash_attention_2" if attn == "flash_attention_2" else "ripplekv_sdpa"
    context = "".join(chr(97 + i % 26) for i in range(120))
    for name in ("adakv", "ripplekv"):
        # under FlashAttention a multi-token pass over head-wise masks uses kvpress's fake keys, which may not exist
        protocols = ("question-aware",) if name == "adakv" and attn != "sdpa" else ("question-aware", "query-agnostic")
        for protocol in protocols:
            press = (
                make_press("adakv", budget=0.3, window_size=8)
                if name == "adakv"
                else RippleKVPress(budget=0.3, scores=SCORES)
            )
            result = generate_answer(model, _Tokenizer(), context, "why?", press, max_new_tokens=6, protocol=protocol)
            assert len(result.token_ids) == 6
            assert model.config._attn_implementation == expected
    # a multi-token pass over a per-layer compressed cache matches token-by-token decoding (the offset is right)
    state = derived_prefill(
        record_prefill(model, random_ids(80, 4).to(CUDA)), RippleKVPress(budget=0.3, scores=SCORES)
    )[0]
    forced = teacher_forced_logprobs(model, state, [3, 5, 8, 13, 21])
    steps = [state.next_logits.float().log_softmax(-1).double().cpu()]
    current = state
    for token in [3, 5, 8, 13]:
        current = extend(model, current, torch.tensor([[token]]))
        steps.append(current.next_logits.float().log_softmax(-1).double().cpu())
    torch.testing.assert_close(forced, torch.stack(steps), atol=5e-2, rtol=5e-2)
