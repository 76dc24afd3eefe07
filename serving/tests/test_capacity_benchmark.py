"""The capacity benchmark's own arithmetic (``benchmarks/serving.py``): fidelity summaries and block footprints.

The engine side of its fidelity measurement is ``ripplekv_vllm.fidelity`` (``test_fidelity.py``,
``test_engine_tiny.py::test_teacher_forcing_in_the_engine``); these check what the benchmark derives from it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ripplekv_vllm.budgets import FractionBudgets
from ripplekv_vllm.hole import hole

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("serving_benchmark", ROOT / "benchmarks" / "serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fidelity_summary(bench) -> None:
    result = {
        "fidelity": {
            "r0": {"kl": [0.0, 0.0, 0.0, 0.0], "top1_equal": 4, "first_difference": 4},
            "r1": {"kl": [0.0, 0.4, 0.2, 0.2], "top1_equal": 2, "first_difference": 1},
        }
    }
    summary = bench.fidelity_summary(result)
    assert summary["answers_equal"] == 0.5
    assert summary["answer_prefix_agreement"] == pytest.approx((1.0 + 0.25) / 2)
    assert summary["top1_match"] == pytest.approx(6 / 8)
    assert summary["kl_mean"] == pytest.approx(0.8 / 8)


def groups(*fractions: float) -> FractionBudgets:
    """One group per layer, each keeping its fraction."""
    return FractionBudgets.of_layers(list(fractions), 32, 64)


def test_footprint_is_the_compacted_blocks_plus_the_tail_and_answer(bench) -> None:
    # the full cache: every slot of prompt and answer
    assert bench.footprint(1000, 1, groups(1.0, 1.0)) == 32  # 1,001 slots
    assert bench.footprint(1000, 25, groups(1.0)) == 33
    # 20% of 1,000 tokens: 6 compacted blocks (192 tokens) + the tail block [992, 1001)
    kept, full = hole(1000, 0.2, 32, 64)
    assert (kept, full) == (192, 992)
    assert bench.footprint(1000, 1, groups(0.2)) == 7
    assert bench.footprint(1000, 24, groups(0.2)) == 7  # slots up to 1,024: still one tail block
    assert bench.footprint(1000, 25, groups(0.2)) == 8
    assert bench.footprint(1000, 1, groups(0.2, 1.0)) == (7 + 32) / 2  # averaged over layers


def test_ceiling(bench) -> None:
    result = {"prompt_lens": [1000, 1000], "kv_pool_blocks": 300, "kv_cache_groups": 3}  # 100 blocks of all layers
    row = bench.ceiling(result, groups(0.2), 256)
    assert row["pool_blocks"] == 100 and row["prompt_blocks"] == 32
    assert row["admit_start"] == pytest.approx((100 - 32) / 7 + 1)
    assert row["hold_end"] == pytest.approx(100 / bench.footprint(1000, 256, groups(0.2)))
    assert bench.footprint(1000, 256, groups(0.2)) == 6 + 9  # slots [992, 1256): 264 tokens in 9 blocks
