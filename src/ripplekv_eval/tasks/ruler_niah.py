"""The RULER-style needle-retrieval tasks (:mod:`ripplekv_eval.tasks.ruler`): single, multi-key, multi-value and
multi-query needles in noise, essay or needle haystacks; :func:`generate_niah` is a
:data:`~ripplekv_eval.tasks.ruler_tasks.Generator` given ``spec = NIAH_TASKS[task]`` first.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ripplekv.profiling.haystack import TextTokenizer, essays
from ripplekv_eval.tasks.ruler_text import (
    Units,
    adjective_words,
    essay_source,
    fit_with_inserts,
    needle_source,
    noise_source,
    noun_words,
)

__all__ = ["NIAH_TASKS", "generate_niah"]

# Needle in a haystack

_DEPTHS = tuple(round(100 * i / 39) / 100 for i in range(40))  # RULER's 40 evenly spaced depths, 0 to 1
_VALUE_LABELS = {"number": "numbers", "word": "words", "uuid": "uuids"}


@dataclass(frozen=True)
class _Niah:
    haystack: str  # "noise" | "essay" | "needle"
    value: str  # "number" | "word" | "uuid"
    keys: int = 1  # keys with needles in the text (distractor needles when > queries)
    values: int = 1  # needles (values) per key
    queries: int = 1  # keys asked about
    key_type: str = "word"  # "word" (adjective-noun) | "uuid"
    max_new_tokens: int = 32


NIAH_TASKS: dict[str, _Niah] = {
    "niah_single_noise_number": _Niah("noise", "number"),
    "niah_single_noise_word": _Niah("noise", "word"),
    "niah_single_noise_uuid": _Niah("noise", "uuid", max_new_tokens=64),
    "niah_single_essay_number": _Niah("essay", "number"),
    "niah_single_essay_word": _Niah("essay", "word"),
    "niah_single_essay_uuid": _Niah("essay", "uuid", max_new_tokens=64),
    "niah_multikey_essay_number": _Niah("essay", "number", keys=4),
    "niah_multikey_needle_number": _Niah("needle", "number"),
    "niah_multikey_needle_uuid": _Niah("needle", "uuid", key_type="uuid", max_new_tokens=64),
    "niah_multivalue_essay_number": _Niah("essay", "number", values=4, max_new_tokens=64),
    "niah_multiquery_essay_number": _Niah("essay", "number", keys=4, queries=4, max_new_tokens=64),
}


def _random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _word_key(index: int) -> str:
    nouns = noun_words()
    return f"{adjective_words()[index // len(nouns)]}-{nouns[index % len(nouns)]}"


def _draw_keys(rng: random.Random, count: int, key_type: str) -> list[str]:
    if key_type == "uuid":
        return [_random_uuid(rng) for _ in range(count)]
    return [_word_key(i) for i in rng.sample(range(len(adjective_words()) * len(noun_words())), count)]


def _value_drawer(rng: random.Random, value_type: str, taken: set[str], words: Sequence[str]) -> Callable[[], str]:
    """Draws values never seen before (``taken`` is updated); words come from ``words`` (no repeats)."""
    pool = list(words)

    def draw() -> str:
        while True:
            if value_type == "number":
                value = str(rng.randint(1_000_000, 9_999_999))
            elif value_type == "uuid":
                value = _random_uuid(rng)
            else:
                if not pool:
                    raise ValueError("ran out of distinct needle words")
                value = pool.pop(rng.randrange(len(pool)))
            if value not in taken:
                taken.add(value)
                return value

    return draw


def _distractor_keys(rng: random.Random, key_type: str, exclude: set[str]) -> Iterator[str]:
    if key_type == "uuid":
        while True:
            key = _random_uuid(rng)
            if key not in exclude:
                yield key
    indices = list(range(len(adjective_words()) * len(noun_words())))
    while True:  # every key once before any repeats
        rng.shuffle(indices)
        for index in indices:
            key = _word_key(index)
            if key not in exclude:
                yield key


def generate_niah(
    spec: _Niah, tokenizer: TextTokenizer, target: int, rng: random.Random, task: str
) -> tuple[str, int, str, tuple[str, ...], str]:
    label = _VALUE_LABELS[spec.value]
    preamble = (
        f"Some special magic {label} are hidden within the following text. Make sure to memorize it. "
        f"I will quiz you about the {label} afterwards."
    )

    def needle(key: str, value: str) -> str:
        return f"One of the special magic {label} for {key} is: {value}."

    keys = _draw_keys(rng, spec.keys, spec.key_type)
    queried = keys[: spec.queries]
    query = queried[0] if len(queried) == 1 else ", ".join(queried[:-1]) + f", and {queried[-1]}"
    question = f"What are all the special magic {label} for {query} mentioned in the provided text?"
    answer_prefix = f" The special magic {label} for {query} mentioned in the provided text are"

    if spec.haystack == "noise":
        units = Units(tokenizer, noise_source(tokenizer))
    elif spec.haystack == "essay":
        units = Units(tokenizer, essay_source(rng.randrange(len(essays()))))
    else:
        units = None  # built below, once the real needles' keys and values are known

    words: list[str] = []
    if spec.value == "word":
        # A value word must not occur anywhere else in the prompt (case-insensitively), or a model could score by
        # repeating some other text: drop words inside the keys, the templates and the haystack text around.
        forbidden = " ".join([preamble, question, answer_prefix, needle("", ""), *keys]).lower()
        if units is not None:
            units.ensure_tokens(1.25 * target)
            forbidden += "".join(units.units).lower()
        words = [w for w in noun_words() if w not in forbidden]
        if len(words) < spec.keys * spec.values:
            words = [w for w in noun_words() if not any(w in key for key in keys)]
    taken: set[str] = set(keys)
    draw_value = _value_drawer(rng, spec.value, taken, words)
    values = {key: [draw_value() for _ in range(spec.values)] for key in keys}
    needles = [needle(key, value) for key in keys for value in values[key]]
    rng.shuffle(needles)
    depths = sorted(rng.sample(_DEPTHS, len(needles)))
    answers = tuple(value for key in queried for value in values[key])

    if units is None:
        filler_rng = random.Random(rng.getrandbits(64))
        filler_keys = _distractor_keys(filler_rng, spec.key_type, set(keys))
        filler_value = _value_drawer(filler_rng, spec.value, taken, [w for w in words if w not in taken])
        units = Units(tokenizer, needle_source(lambda: needle(next(filler_keys), filler_value())))

    context, count = fit_with_inserts(tokenizer, target, task, units, preamble, list(zip(depths, needles)))
    return context, count, question, answers, answer_prefix
