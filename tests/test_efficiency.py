"""Efficiency accounting: the computed KV-byte table, and held vs kept bytes measured on a tiny random model."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvpress import SnapKVPress
from transformers import DynamicCache

from benchmarks.efficiency import COMPUTED_BUDGETS, COMPUTED_LENGTHS, PUBLISHED, resumed_rows, write_result
from benchmarks.kv_accounting import (
    INDEX_BYTES,
    KVShape,
    cache_footprint,
    computed_kv_table,
    state_bytes,
)
from ripplekv.allocation.budget import ProfileSchedule
from ripplekv.inference.generate import full_cache_bytes, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import random_ids, tiny_model

GIB = 2**30
WINDOW = 8
N = 96
LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 16  # tiny_model: hidden 64 over 4 query heads, 2 KV heads
SCORES = (0.1, 2.0, 0.5, 1.2)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_published_shapes_and_computed_table() -> None:
    shapes = {s.name: (s.layers, s.kv_heads, s.head_dim) for s in PUBLISHED}
    assert shapes == {
        "Llama-3.1-8B-Instruct": (32, 8, 128),
        "Qwen2.5-7B-Instruct": (28, 4, 128),
        "Mistral-7B-Instruct-v0.3": (32, 8, 128),
    }
    assert COMPUTED_LENGTHS == (32768, 131072) and COMPUTED_BUDGETS == (0.1, 0.2, 0.3)
    rows = {(r["model"], r["tokens"], r["budget"]): r for r in computed_kv_table(PUBLISHED, COMPUTED_LENGTHS, (0.1,))}
    assert len(rows) == 3 * 2
    llama = rows["Llama-3.1-8B-Instruct", 32768, 0.1]
    # 2 (K and V) x 32 layers x 8 heads x 128 dims x 2 bytes = 128 KiB per token: 4 GiB at 32K, 16 GiB at 128K
    assert llama["full_bytes"] == 4 * GIB and rows["Llama-3.1-8B-Instruct", 131072, 0.1]["full_bytes"] == 16 * GIB
    assert rows["Mistral-7B-Instruct-v0.3", 32768, 0.1]["full_bytes"] == 4 * GIB
    assert rows["Qwen2.5-7B-Instruct", 32768, 0.1]["full_bytes"] == 1.75 * GIB  # 56 KiB per token
    # 10% of 32768 is 3276 tokens in kvpress's float arithmetic (1 - 0.9 = 0.0999...)
    assert llama["kept_tokens"] == 3276 and llama["evicting_bytes"] == 3276 * 131072
    assert llama["adakv_bytes"] == llama["full_bytes"]  # kvpress's AdaKV frees nothing
    assert llama["adakv_index_bytes"] == 32 * 8 * (32768 - 3276) * 24
    qwen = rows["Qwen2.5-7B-Instruct", 131072, 0.1]
    assert qwen["kept_tokens"] == 13107 and qwen["evicting_bytes"] == 13107 * 57344
    assert qwen["kept_fraction"] == 13107 / 131072


def test_kv_shape_matches_a_models_full_cache() -> None:
    model = tiny_model("qwen2", layers=LAYERS)
    shape = KVShape("tiny", LAYERS, KV_HEADS, HEAD_DIM)
    assert shape.cache_bytes(N, element_bytes=4) == full_cache_bytes(model, N)
    for bad in ({"layers": 0}, {"kv_heads": 2.5}, {"head_dim": -1}):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            KVShape(**{"name": "m", "layers": 1, "kv_heads": 1, "head_dim": 1, **bad})


@pytest.fixture(scope="module")
def model():
    return enable_varlen_attention(tiny_model("llama", layers=LAYERS))


def test_held_and_kept_bytes_of_each_method(model) -> None:
    ids = random_ids(N, seed=2)
    kept = int(N * (1 - 0.75))  # 24 tokens per layer and head at 25%
    per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # float32
    presses = {
        "full": make_press("full"),
        "snapkv": make_press("snapkv", budget=0.25, window_size=WINDOW),
        "pyramidkv": make_press("pyramidkv", budget=0.25, window_size=WINDOW),
        "ripplekv": RippleKVPress(SnapKVPress(window_size=WINDOW), budget=0.25, scores=SCORES),
        "adakv": make_press("adakv", budget=0.25, window_size=WINDOW),
        "ripplekv-ada": LayerBudgetAdaPress(SnapKVPress(window_size=WINDOW), ProfileSchedule(0.25, SCORES)),
    }
    record = record_prefill(model, ids)
    for name, press in presses.items():
        state = prefill(model, ids, press)
        fp = cache_footprint(model, state)
        assert fp.full_bytes == N * per_token and fp.layers == LAYERS and fp.prompt_tokens == N
        assert fp == cache_footprint(model, derived_prefill(record, press)[0]), name  # shared prefill: same account
        if name == "full":
            assert (fp.held_fraction, fp.kept_fraction, fp.state_bytes) == (1.0, 1.0, 0)
        elif name in ("snapkv", "pyramidkv", "ripplekv"):  # evicting: holds exactly what it keeps
            assert fp.held_bytes == kept * per_token and fp.state_bytes == 0, name
            assert fp.held_fraction == fp.kept_fraction == kept / N, name
        else:  # head-wise masks: every key held, the dropped entries as int64 index triples
            assert fp.kept_fraction == kept / N, name
            masked_entries = LAYERS * KV_HEADS * N - KV_HEADS * sum(fp.kept_tokens)
            evicted_tokens = LAYERS * N - sum(layer.keys.shape[2] for layer in state.cache.layers)
            assert fp.held_bytes == (LAYERS * N - evicted_tokens) * per_token // LAYERS
            assert fp.state_bytes <= masked_entries * INDEX_BYTES
            if name == "adakv":
                assert fp.held_fraction == 1.0 and fp.state_bytes == masked_entries * INDEX_BYTES
    assert state_bytes(DynamicCache()) == 0


def test_efficiency_resume_keeps_finished_lengths_of_the_same_settings(tmp_path: Path) -> None:
    out = str(tmp_path / "eff.json")
    settings = {"model": "m", "repeats": 3, "budgets": [0.1]}
    rows = [{"tokens": 1024, "method": "snapkv"}, {"tokens": 2048, "method": "snapkv"}]
    assert resumed_rows(out, settings, (1024,)) == []  # nothing written yet
    write_result(out, {"settings": settings, "complete": False, "measured": rows})
    assert resumed_rows(out, settings, (1024, 2048, 4096)) == rows
    assert resumed_rows(out, settings, (1024, 4096)) == rows[:1]  # a length not asked for is dropped
    assert resumed_rows(out, {**settings, "repeats": 1}, (1024, 2048)) == []  # other settings: measure again
