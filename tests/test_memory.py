"""Memory-lean passes: overlay forks, decode rows and bounded groups give exactly what the copying paths give."""

from __future__ import annotations

import argparse

import pytest
import torch
from kvpress import SnapKVPress

from ripplekv.inference.generate import extend, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import OverlayLayer, cache_tensors, lean_fork
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv_eval.cli.eval import memory_size
from ripplekv_eval.fastpath.batched import (
    batched_greedy_decode_rows,
    decode_row,
    padded_batch,
    row_bytes,
)
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.running.rows import lean_extend
from tests.conftest import decode_batch, random_ids, tiny_model

WINDOW = 8
LAYERS = 4
SCORES = (0.5, 3.0, 0.1, 1.2)

pytestmark = pytest.mark.usefixtures("one_thread")


def _presses() -> dict:
    return {
        "full": FullPress(),
        "snapkv": make_press("snapkv", budget=0.3, window_size=WINDOW),
        "adakv": make_press("adakv", budget=0.3, window_size=WINDOW),
        "ripplekv": RippleKVPress(press=SnapKVPress(window_size=WINDOW), budget=0.3, scores=SCORES),
    }


@pytest.fixture(scope="module")
def model():
    return enable_varlen_attention(tiny_model("llama", layers=LAYERS))


def test_lean_passes_equal_the_copying_passes(model) -> None:
    context, question, answer = random_ids(72, seed=20), random_ids(7, seed=21), [5, 17, 3, 99, 42]
    record = record_prefill(model, context, hidden_tail=WINDOW + 1)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in record.layers]
    for name, press in _presses().items():
        state = derived_prefill(record, press)[0]
        for over in (state, None):
            if over is None:  # a question run over the cache first (query-agnostic)
                lean, copied = lean_extend(model, state, question), extend(model, state, question)
                assert torch.equal(lean.next_logits, copied.next_logits), name
                assert lean.prompt_tokens == copied.prompt_tokens
                assert all(isinstance(layer, OverlayLayer) for layer in lean.cache.layers)
                for layer, (keys, values) in zip(lean.cache.layers, cache_tensors(copied.cache)):
                    assert layer.get_seq_length() == keys.shape[2]
                    assert all(torch.equal(a, b) for a, b in zip(layer.whole(), (keys, values)))
            else:
                lean = copied = state
            expected = teacher_forced_logprobs(model, copied, answer)
            assert torch.equal(teacher_forced_logprobs(model, lean, answer, fork=lean_fork), expected), name
            assert greedy_decode(model, lean, 6, set(), 1, fork=lean_fork) == greedy_decode(
                model, copied, 6, set(), 1
            ), name
    for layer, (keys, values) in zip(record.layers, before):  # nothing wrote into the record
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


def test_lean_fork_holds_the_cache_by_reference(model) -> None:
    record = record_prefill(model, random_ids(40, seed=22), hidden_tail=0)
    fork = lean_fork(record.full_cache())
    for layer, recorded in zip(fork.layers, record.layers):
        assert layer.base_keys is recorded.keys and layer.keys.shape[2] == 0
        new = torch.randn(1, 2, 3, recorded.keys.shape[3])
        keys, _ = layer.update(new, new)
        assert keys.shape[2] == 43 and layer.keys.shape[2] == 3  # appended kept apart, the whole not kept
        assert layer.get_seq_length() == 43 and layer.base_keys is recorded.keys
        assert torch.equal(keys[:, :, :40], recorded.keys)


def test_decode_rows_decode_as_the_batch_of_their_caches(model) -> None:
    context, question = random_ids(72, seed=23), random_ids(5, seed=24)
    record = record_prefill(model, context)
    states = [derived_prefill(record, press)[0] for name, press in _presses().items() if name != "full"]
    expected = decode_batch(model, states, 6, set(), 1)
    rows = [decode_row(state, 6) for state in states]
    for row, state in zip(rows, states):
        assert row.nbytes() == row_bytes(state, 6)
        for (key_buffer, _), (keys, _) in zip(row.buffers, cache_tensors(state.cache)):
            assert key_buffer.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr()  # its own copy
    assert rows[1].nbytes() < sum(t.numel() * t.element_size() for t in cache_tensors(states[1].cache)[0]) * LAYERS
    assert batched_greedy_decode_rows(model, rows, 6, set(), 1) == expected
    assert batched_greedy_decode_rows(model, rows, 6, set(), 1) == expected  # decoding twice is the same
    # caches over overlay forks (a question run with lean_extend) lay out as their copied versions
    lean = [lean_extend(model, state, question) for state in states]
    copied = [extend(model, state, question) for state in states]
    assert batched_greedy_decode_rows(model, [decode_row(s, 6) for s in lean], 6, set(), 1) == decode_batch(
        model, copied, 6, set(), 1
    )
    for a, b in zip(padded_batch(lean)[0].layers, padded_batch(copied)[0].layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    with pytest.raises(ValueError, match="room for 2 tokens, 6 may be decoded"):
        batched_greedy_decode_rows(model, [decode_row(states[0], 2)], 6, set(), 0)


def test_memory_size_parses_units() -> None:
    assert memory_size("1024") == 1024
    assert memory_size("512MiB") == 512 * 2**20
    assert memory_size("1.5G") == 3 * 2**29
    assert memory_size("2 gib") == 2 * 2**30
    for bad in ("", "0", "-1G", "2TB", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            memory_size(bad)
