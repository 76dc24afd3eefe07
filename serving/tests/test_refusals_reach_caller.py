"""Every refusal reaches the caller's own exception, in-process and under vLLM's default multiprocess engine.

The plugin's platform checks the settings while vLLM builds the engine's config in the caller's process, so the
refusal is raised there (vLLM's pydantic config reports it as a ``ValidationError`` carrying the text) instead of in
the engine core, whose failure reaches the caller as ``Engine core initialization failed``. Each engine mode runs in
a child process (the mode is read when vLLM is imported) that tries every case and reports what it caught.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_support import save_tiny

LAYERS = 30  # SmolLM2-135M
REQUIRED = {"enable_prefix_caching": False, "enable_chunked_prefill": False, "block_size": 32}
"""The engine settings RippleKV needs beside vLLM's defaults."""
FITTED = {**REQUIRED, "max_model_len": 2048}
"""Those, with the context cut to vLLM's default batched-token budget: an engine the plugin accepts."""
SMALL = {**REQUIRED, "max_model_len": 512, "max_num_batched_tokens": 512}


def cases(model_dir: str, alibi_dir: str, sliding_dir: str) -> list[dict[str, Any]]:
    """``{name, model, settings, engine, message}``: an engine start and the text its refusal must carry."""
    fractions = {"keep_fractions": [0.5] * LAYERS}
    listed: list[dict[str, Any]] = [
        {"name": "vLLM's defaults", "engine": {}, "message": "ripplekv: prefix caching is on"},
        {
            "name": "a long-prefill threshold",
            "engine": {**FITTED, "long_prefill_token_threshold": 256},
            "message": "ripplekv: long_prefill_token_threshold=256 cuts long prompts into pieces, which only chunked",
        },
        {
            "name": "one KV-cache group forced",
            "engine": {**FITTED, "disable_hybrid_kv_cache_manager": True},
            "message": "ripplekv: disable_hybrid_kv_cache_manager is on",
        },
        {
            "name": "a block size the kernel cannot free",
            "engine": {**FITTED, "block_size": 16},
            "message": "ripplekv: block_size 16 is not a multiple of 32",
        },
        {
            "name": "an unknown setting",
            "settings": {"keep_fraction": 0.5},
            "engine": FITTED,
            "message": "additional_config['ripplekv'] has unknown settings ['keep_fraction']",
        },
        {
            "name": "a kept fraction out of range",
            "settings": {"keep_fractions": [1.5] * LAYERS},
            "engine": FITTED,
            "message": "ripplekv: keep_fractions[0] is 1.5; it must be in (0, 1]",
        },
        {
            "name": "another worker",
            "engine": {**FITTED, "worker_cls": "vllm.v1.worker.gpu_worker.Worker"},
            "message": "ripplekv serves with its own worker, but worker_cls='vllm.v1.worker.gpu_worker.Worker'",
        },
        {
            "name": "an ALiBi model",
            "model": alibi_dir,
            "settings": {"keep_fractions": [0.5, 0.5]},
            "engine": SMALL,
            "message": "ripplekv: the model (BloomForCausalLM) uses ALiBi",
        },
        {
            "name": "a sliding-window model",
            "model": sliding_dir,
            "settings": {"keep_fractions": [0.5, 0.5]},
            "engine": SMALL,
            "message": "ripplekv serves full-attention layers only; the model has a sliding window of 64 tokens in "
            "layers [0]",
        },
    ]
    return [{"model": model_dir, "settings": fractions, **case} for case in listed]


@pytest.fixture(scope="module")
def refusal_cases(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("refusals")
    torch.manual_seed(0)
    bloom = BloomConfig(vocab_size=49152, hidden_size=64, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    alibi = save_tiny(model_dir, root / "bloom", BloomForCausalLM(bloom))
    llama = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=64,  # as Gemma-style hybrid models: the first layer slides, the second attends to all
        layer_types=["sliding_attention", "full_attention"],
    )
    sliding = save_tiny(model_dir, root / "sliding", LlamaForCausalLM(llama))
    return cases(model_dir, alibi, sliding)


def caught_in_child(multiprocess: bool, listed: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """Run every case in a fresh interpreter in the given engine mode; what each start raised."""
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(listed))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0"}
    done = subprocess.run(
        [sys.executable, __file__, str(spec)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(lines) == len(listed), done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("multiprocess", [True, False], ids=["multiprocess engine", "in-process engine"])
def test_every_refusal_reaches_the_caller(
    refusal_cases: list[dict[str, Any]], multiprocess: bool, tmp_path: Path
) -> None:
    for case, got in zip(refusal_cases, caught_in_child(multiprocess, refusal_cases, tmp_path), strict=True):
        assert got["raised"], f"{case['name']}: the engine started"
        assert case["message"] in got["text"], f"{case['name']}: the caller got {got['type']}: {got['text'][:400]}"
        assert "Engine core initialization failed" not in got["text"]


def _main(spec: str) -> None:
    """The child: start each case's engine and print what the start raised, one JSON line per case."""
    from vllm import LLM

    for case in json.loads(Path(spec).read_text()):
        engine = {"dtype": "float32", "enforce_eager": True, **case["engine"]}
        try:
            llm = LLM(model=case["model"], additional_config={"ripplekv": case["settings"]}, **engine)
        except Exception as error:  # what reaches the caller, whatever vLLM wraps it in
            print(json.dumps({"raised": True, "type": type(error).__name__, "text": str(error)}), flush=True)
        else:
            llm.llm_engine.engine_core.shutdown()
            print(json.dumps({"raised": False, "type": "", "text": ""}), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1])
