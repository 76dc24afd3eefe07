"""Tokenizer files for a GGUF model, repairing what transformers 5.2 gets wrong reading a GGUF tokenizer itself.

For SmolLM2 (byte-level BPE) it makes eos ``<|im_start|>`` instead of ``<|im_end|>`` (generation never stops),
prepends a BOS the GGUF disables, and appends five tokens beyond the 49,152-row embedding. For Gemma 3
(SentencePiece BPE, no merges stored) it splits every word into characters (loss ~9.5 nats per token). Both kinds
are rebuilt here; other tokenizers keep transformers' with the GGUF's special tokens.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# loading's logger, which log filters and captures match
logger = logging.getLogger("ripplekv.models.loading")

#: ChatML as used by SmolLM2-Instruct; used when a GGUF with ChatML tokens carries no chat template of its own
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# GPT-2 byte-level regex is applied by ``pre_tokenizers.ByteLevel(use_regex=True)``; these GGUF
# ``tokenizer.ggml.pre`` values need nothing else, except "smollm" which first isolates every digit
_GPT2_STYLE_PRE = {"gpt2", "default", "smollm"}


def gguf_metadata(gguf_path: Path) -> dict[str, Any]:
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


def _bos_template(meta: dict[str, Any], tokens: list[str]) -> Any:
    """The post-processor prepending BOS when the GGUF asks for it (``add_bos_token``), else None."""
    from tokenizers import processors

    bos = _token_or_none(tokens, meta.get("tokenizer.ggml.bos_token_id"))
    if not bool(meta.get("tokenizer.ggml.add_bos_token", False)) or bos is None:
        return None
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tokens.index(bos))]
    )


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
    byte_post = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    bos = _bos_template(meta, tokens)
    tokenizer.post_processor = byte_post if bos is None else processors.Sequence([byte_post, bos])
    return tokenizer


# GGUF token types (llama.cpp's ``llama_token_type``)
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6


def spm_merges(tokens: list[str], scores: list[float], token_types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece BPE over ``tokens``: every split of a normal piece (type 1) into two
    normal pieces, highest-scoring joined piece first (ties: by the halves' ids, so the order is deterministic).

    SentencePiece BPE merges, at each step, the adjacent pair whose joined piece scores highest.
    """
    if not len(tokens) == len(scores) == len(token_types):
        raise ValueError(f"{len(tokens)} tokens, {len(scores)} scores and {len(token_types)} token types")
    normal = {tok: i for i, (tok, kind) in enumerate(zip(tokens, token_types)) if kind == _NORMAL}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, piece_id in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            left_id, right_id = normal.get(left), normal.get(right)
            if left_id is not None and right_id is not None:
                ranked.append((-float(scores[piece_id]), left_id, right_id, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def _build_spm_tokenizer(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` for a SentencePiece BPE GGUF: byte fallback, spaces as ``▁`` (with a leading
    ``▁`` when ``add_space_prefix``), control and user-defined pieces matched whole before normalisation, BOS when
    ``add_bos_token``."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    scores: list[float] = [float(x) for x in meta["tokenizer.ggml.scores"]]
    token_types: list[int] = [int(x) for x in meta.get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens))]
    unk = _token_or_none(tokens, meta.get("tokenizer.ggml.unknown_token_id"))
    tokenizer = Tokenizer(
        BPE(
            vocab={tok: i for i, tok in enumerate(tokens)},
            merges=spm_merges(tokens, scores, token_types),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [normalizers.Prepend("▁")] if bool(meta.get("tokenizer.ggml.add_space_prefix", False)) else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    decode_steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if steps:
        decode_steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode_steps)
    tokenizer.add_tokens(
        [AddedToken(tok, normalized=False) for tok, kind in zip(tokens, token_types) if kind == _USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok, kind in zip(tokens, token_types) if kind == _CONTROL]
    )
    bos = _bos_template(meta, tokens)
    if bos is not None:
        tokenizer.post_processor = bos
    return tokenizer


def _special_token_ids(meta: dict[str, Any]) -> dict[str, int | None]:
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}
    values = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in keys.items()}
    ids = {name: int(value) if isinstance(value, int) else None for name, value in values.items()}
    if ids["pad"] is None:
        ids["pad"] = ids["eos"]
    return ids


def convert_tokenizer(gguf_path: Path, meta: dict[str, Any], out_dir: Path) -> dict[str, int | None]:
    """Write fixed tokenizer files to ``out_dir``; return the special token ids used."""
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens", []))
    ids = _special_token_ids(meta)
    chatml = "<|im_start|>" in tokens and "<|im_end|>" in tokens
    chat_template = meta.get("tokenizer.chat_template") or (CHATML_TEMPLATE if chatml else None)
    names = {key: _token_or_none(tokens, value) for key, value in ids.items()}
    if names["eos"] is None:
        raise RuntimeError(f"{gguf_path.name}: the GGUF declares no valid eos token id")
    tokenizer_model = meta.get("tokenizer.ggml.model")
    gpt2_bpe = tokenizer_model == "gpt2" and meta.get("tokenizer.ggml.pre", "default") in _GPT2_STYLE_PRE
    spm_bpe = tokenizer_model == "llama" and "tokenizer.ggml.scores" in meta and "tokenizer.ggml.merges" not in meta
    if gpt2_bpe or spm_bpe:
        backend = _build_bpe_tokenizer(meta) if gpt2_bpe else _build_spm_tokenizer(meta)
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
