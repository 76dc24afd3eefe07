"""Loading causal LMs (a local Hugging Face directory, a hub id, a ``.gguf`` file, or a short alias).

A GGUF file is converted once to a Hugging Face directory under :func:`cache_root`, written to a temporary
directory renamed into place when complete, so an interrupted conversion leaves no half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.gguf_tokenizer import convert_tokenizer, gguf_metadata
from ripplekv.models.sources import DEFAULT_MODEL, cache_root, resolve_device, resolve_dtype, resolve_model_source

logger = logging.getLogger(__name__)

#: bump when a converted directory's layout or content changes, so old cache entries are not reused
CONVERSION_FORMAT = 2
CONVERSION_MARKER = "ripplekv_conversion.json"


def _file_fingerprint(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 prefix over the size and the first and last MiB of a file (cheap, stable across copies)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(chunk))
        if size > chunk:
            handle.seek(max(chunk, size - chunk))
            digest.update(handle.read(chunk))
    return digest.hexdigest()[:16]


def gguf_cache_key(gguf_path: str | os.PathLike[str]) -> str:
    """Cache subdirectory name of a GGUF file: file stem, size, content fingerprint and format versions."""
    path = Path(gguf_path)
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "_", path.stem)
    tf_major = transformers.__version__.split(".")[0]
    return f"{stem}-{path.stat().st_size}-{_file_fingerprint(path)}-f{CONVERSION_FORMAT}-tf{tf_major}"


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _write_converted(gguf_path: Path, out_dir: Path) -> None:
    """Convert ``gguf_path`` into an (existing, empty) directory ``out_dir``."""
    meta = gguf_metadata(gguf_path)
    ids = convert_tokenizer(gguf_path, meta, out_dir)
    with _quiet_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or model.config.vocab_size
    for key, value in ids.items():
        if key == "unk" or value is None:
            continue
        if value >= vocab:
            raise RuntimeError(f"{gguf_path.name}: {key} token id {value} is outside the vocabulary ({vocab})")
    model.config.bos_token_id = ids["bos"]
    model.config.eos_token_id = ids["eos"]
    model.config.pad_token_id = ids["pad"]
    model.config.name_or_path = gguf_path.stem
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    # float32 keeps the dequantized weights exact (Q4_1 / Q8_0 values are not representable in bf16)
    with _quiet_progress_bars():
        model.save_pretrained(str(out_dir))
    del model
    marker = {
        "source": str(gguf_path),
        "source_size": gguf_path.stat().st_size,
        "source_fingerprint": _file_fingerprint(gguf_path),
        "format": CONVERSION_FORMAT,
        "transformers": transformers.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "special_token_ids": ids,
    }
    (out_dir / CONVERSION_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: str | os.PathLike[str], target_dir: str | os.PathLike[str]) -> Path:
    """Convert a GGUF file to a Hugging Face directory at ``target_dir`` (which must not exist), atomically; if
    another process finished the same conversion first, its result is kept."""
    source = Path(gguf_path)
    target = Path(target_dir)
    if not source.is_file():
        raise FileNotFoundError(f"GGUF file not found: {source}")
    if target.exists():
        raise FileExistsError(f"conversion target already exists: {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    started = time.perf_counter()
    try:
        _write_converted(source, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / CONVERSION_MARKER).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent conversion won the race
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s to %s in %.1f s", source.name, target, time.perf_counter() - started)
    return target


def ensure_converted(gguf_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached Hugging Face directory of a GGUF file, converting it first if needed."""
    source = Path(gguf_path)
    if not source.is_file():
        raise FileNotFoundError(f"GGUF file not found: {source}")
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / gguf_cache_key(source)
    if (target / CONVERSION_MARKER).is_file():
        return target
    if target.exists():  # not produced by convert_gguf (which renames only complete directories)
        raise RuntimeError(
            f"cache entry {target} exists but is incomplete (no {CONVERSION_MARKER}); delete it to reconvert"
        )
    logger.info("converting %s to a Hugging Face checkpoint under %s (once)", source.name, root)
    return convert_gguf(source, target)


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM (a Hugging Face directory, a hub id, a ``.gguf`` file or a directory holding one, or an
    alias of :mod:`ripplekv.models.sources`) and its tokenizer, in eval mode; ``sdpa`` and ``eager`` are switched to
    their variable-length variants (:func:`~ripplekv.models.attention.enable_varlen_attention`)."""
    target_device = resolve_device(device)
    target_dtype = resolve_dtype(dtype, target_device)
    kind, source = resolve_model_source(name_or_path)
    load_from = str(ensure_converted(source)) if kind == "gguf" else str(source)
    tokenizer = AutoTokenizer.from_pretrained(load_from)
    model = AutoModelForCausalLM.from_pretrained(load_from, dtype=target_dtype, attn_implementation=attn_implementation)
    model.to(target_device)
    model.eval()
    if kind == "gguf":
        model.config.name_or_path = os.fspath(name_or_path)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if attn_implementation in ("sdpa", "eager"):
        enable_varlen_attention(model)
    return model, tokenizer
