"""SentencePiece BPE GGUF tokenizers (Gemma, Llama 2, Mistral) rebuilt from pieces and scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from ripplekv.models.gguf_tokenizer import convert_tokenizer, spm_merges

CONTROL, NORMAL, USER, BYTE = 3, 1, 4, 6


def _meta(pieces: dict[str, float], add_bos: bool = True, space_prefix: bool = False) -> dict[str, Any]:
    """A SentencePiece BPE GGUF's tokenizer fields: specials, 256 byte pieces, ``pieces`` (normal, with scores),
    one user-defined piece and one control piece."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [CONTROL] * 4
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    tokens += list(pieces) + ["\n\n", "<start_of_turn>"]
    types += [NORMAL] * len(pieces) + [USER, CONTROL]
    scores = [-1000.0] * 4 + [0.0] * 256 + list(pieces.values()) + [0.0, -1000.0]
    return {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_space_prefix": space_prefix,
    }


PIECES = {"▁": -9.0, "a": -8.0, "b": -8.0, "c": -8.0, "ab": -3.0, "bc": -2.0, "▁a": -4.0, "▁abc": -1.0}


def _load(tmp_path: Path, meta: dict[str, Any], name: str = "tok") -> Any:
    out = tmp_path / name
    out.mkdir()
    convert_tokenizer(tmp_path / "model.gguf", meta, out)
    return AutoTokenizer.from_pretrained(str(out))


def _pieces(tokenizer: Any, text: str) -> list[str]:
    return tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)


def test_the_highest_scoring_joined_piece_is_merged_first(tmp_path: Path) -> None:
    tokenizer = _load(tmp_path, _meta(PIECES))
    # "bc" (-2) outscores "ab" (-3): SentencePiece joins b+c first, and no piece "abc" exists
    assert _pieces(tokenizer, "abc") == ["<bos>", "a", "bc"]
    # " abc" -> ▁ a b c -> ▁ a bc -> ▁a bc (no "abc" piece) -> ▁abc
    assert _pieces(tokenizer, " abc") == ["<bos>", "▁abc"]
    assert _pieces(tokenizer, "ab") == ["<bos>", "ab"]


def test_merges_are_every_split_ranked_by_the_joined_score() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc", "<x>"]
    scores = [0.0, 0.0, 0.0, -3.0, -2.0, -1.0, 5.0]
    types = [NORMAL] * 6 + [CONTROL]
    assert spm_merges(tokens, scores, types) == [("a", "bc"), ("ab", "c"), ("b", "c"), ("a", "b")]
    with pytest.raises(ValueError, match="scores"):
        spm_merges(tokens, scores[:-1], types)


def test_bytes_fall_back_and_text_round_trips(tmp_path: Path) -> None:
    tokenizer = _load(tmp_path, _meta(PIECES))
    text = "ab é\n\nabc"
    pieces = _pieces(tokenizer, text)
    assert "<0xC3>" in pieces and "<0xA9>" in pieces  # é is not a piece: its UTF-8 bytes
    assert "\n\n" in pieces  # the user-defined piece is matched whole
    assert "<unk>" not in pieces
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_bos_and_space_prefix_follow_the_gguf(tmp_path: Path) -> None:
    plain = _load(tmp_path, _meta(PIECES, add_bos=False))
    assert _pieces(plain, "abc") == ["a", "bc"]
    prefixed = _load(tmp_path, _meta(PIECES, add_bos=False, space_prefix=True), name="prefixed")
    assert _pieces(prefixed, "abc") == ["▁abc"]
    assert prefixed.decode(prefixed("abc").input_ids) == "abc"


def test_control_pieces_are_special_and_no_chatml_template_is_invented(tmp_path: Path) -> None:
    tokenizer = _load(tmp_path, _meta(PIECES))
    ids = tokenizer("<start_of_turn>ab").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "<start_of_turn>", "ab"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
    assert tokenizer.bos_token == "<bos>" and tokenizer.eos_token == "<eos>"
    assert not tokenizer.chat_template  # a Gemma vocabulary has no ChatML tokens
