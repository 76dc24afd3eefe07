"""Shared fixtures of the RippleKV vLLM plugin's tests (run in the vLLM environment only).

The engine tests load the SmolLM2-135M directory the library converted (``benchmarks/results/vllm-probe/
reference.json``'s ``model_dir``) in vLLM's in-process engine (float32, eager, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
and feed it BAMBOO contexts (``benchmarks/heldout/bamboo.jsonl``) cut to a few hundred tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core and worker in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB

pytest.importorskip("vllm", reason="the serving tests run in the vLLM environment (benchmarks/serving/test.sh)")

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "benchmarks" / "results" / "vllm-probe" / "reference.json"
BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The library's converted SmolLM2-135M directory (skips the engine tests when it was never converted)."""
    directory = json.loads(REFERENCE.read_text())["model_dir"] if REFERENCE.exists() else ""
    if not directory or not Path(directory).is_dir():
        pytest.skip(f"no converted SmolLM2-135M directory (run benchmarks/serving/reference.py): {directory!r}")
    return directory


@pytest.fixture(scope="session")
def bamboo_ids(model_dir: str):
    """``bamboo_ids(record, tokens)``: the first ``tokens`` token ids of a BAMBOO record's context."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    records = [json.loads(line) for line in BAMBOO.read_text().splitlines() if line.strip()]

    def ids(record: int, tokens: int) -> list[int]:
        out = tokenizer.encode(records[record]["context"], add_special_tokens=False).ids[:tokens]
        assert len(out) == tokens, f"record {record} has fewer than {tokens} tokens"
        return out

    return ids
