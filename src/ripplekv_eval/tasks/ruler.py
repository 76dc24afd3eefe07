"""RULER-style synthetic long-context tasks, generated locally from a seed and scored by string match.

The task families follow RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"): needle retrieval (single, multi-key, multi-value and multi-query needles in noise, essay or needle
haystacks), variable tracking, common- and frequent-words extraction. Nothing is downloaded: the haystack is
:mod:`ripplekv.profiling.haystack`'s essays, other text is drawn from a seeded :class:`random.Random`; contexts are
sized in the tokenizer's tokens (:mod:`~ripplekv_eval.tasks.ruler_text`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ripplekv.profiling.haystack import TextTokenizer, essays
from ripplekv.validation import check_int
from ripplekv_eval.tasks.ruler_text import (
    NOISE,
    Batch,
    Units,
    adjective_words,
    count_tokens,
    cwe_words,
    essay_source,
    fit_context,
    fit_with_inserts,
    needle_source,
    noise_source,
    noun_words,
    piece_token_counts,
)


@dataclass(frozen=True)
class SyntheticSample:
    task: str  # e.g. "niah_single_essay_number"
    context: str  # the long text: task instruction, then haystack with needles / variable chains / word list
    question: str  # the query, asked after the context
    answers: tuple[str, ...]  # every one must appear in the prediction (RULER's string_match_all)
    context_tokens: int  # token count of ``context``, measured with the tokenizer that built it
    seed: int
    max_new_tokens: int
    answer_prefix: str = ""  # RULER's answer prefix (starts with a space), for prompting base models


Generated = tuple[str, int, str, tuple[str, ...], str]
"""What a task's generator returns: ``(context, context_tokens, question, answers, answer_prefix)``."""
Generator = Callable[..., Generated]
"""``(tokenizer, target, rng, task) -> Generated``."""


# Variable tracking

_VT_CHAINS = 1  # RULER's defaults
_VT_HOPS = 4
_VT_NAME_LENGTH = 5


def _generate_vt(tokenizer: TextTokenizer, target: int, rng: random.Random, task: str) -> Generated:
    preamble = "Memorize and track the chain(s) of variable assignment hidden in the following text."
    forbidden = (NOISE + preamble + "question find all variables that are assigned the value in the text above").lower()
    names: list[str] = []
    while len(names) < _VT_CHAINS * (_VT_HOPS + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=_VT_NAME_LENGTH))
        if name not in names and name.lower() not in forbidden:
            names.append(name)
    chain_values = rng.sample(range(10_000, 100_000), _VT_CHAINS)
    statements: list[tuple[float, str]] = []  # (relative position, statement)
    for c, value in enumerate(chain_values):
        chain = names[c * (_VT_HOPS + 1) : (c + 1) * (_VT_HOPS + 1)]
        texts = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])]
        positions = sorted(rng.random() for _ in texts)
        statements.extend(zip(positions, texts))
    query_value = chain_values[0]
    answers = tuple(names[: _VT_HOPS + 1])
    question = f"Question: Find all variables that are assigned the value {query_value} in the text above."
    answer_prefix = (
        f" Answer: According to the chain(s) of variable assignment in the text above, {len(answers)} variables "
        f"are assigned the value {query_value}, they are: "
    )

    hay = Units(tokenizer, noise_source(tokenizer))
    context, count = fit_with_inserts(tokenizer, target, task, hay, preamble, statements)
    return context, count, question, answers, answer_prefix


# Common words extraction

_CWE_COMMON = 10  # words asked for
_CWE_FREQ_COMMON = 30  # RULER's frequencies for long lists; scaled down for short ones (see _cwe_frequencies)
_CWE_FREQ_UNCOMMON = 3
_CWE_COMMON_SHARE = 0.375  # common entries / all entries at the length where RULER's 30 repeats just fit
_CWE_MIN_ENTRIES = _CWE_COMMON * 2 + 10


def _cwe_frequencies(entries: int, vocabulary: int) -> tuple[int, int]:
    """Repeats of each common word and of each uncommon word for a list of ``entries`` entries.

    Short lists scale the common count down (at least 2, always above the uncommon count); lists too long for the
    vocabulary at RULER's 3 uncommon repeats raise both counts, keeping common words 10x as frequent.
    """
    common = min(_CWE_FREQ_COMMON, max(2, round(_CWE_COMMON_SHARE * entries / _CWE_COMMON)))
    uncommon = max(1, min(_CWE_FREQ_UNCOMMON, common // 10))
    rest = entries - _CWE_COMMON * common
    if math.ceil(rest / uncommon) > vocabulary:
        uncommon = math.ceil(rest / vocabulary)
        common = max(common, 10 * uncommon)
    return common, uncommon


def _cwe_counts(entries: int, common_words: Sequence[str], uncommon_words: Sequence[str]) -> dict[str, int]:
    common, uncommon = _cwe_frequencies(entries, len(uncommon_words))
    rest = entries - len(common_words) * common
    full, extra = divmod(rest, uncommon)
    counts = {word: common for word in common_words}
    for i in range(extra):  # leftover entries go to common words: they stay the most frequent
        counts[common_words[i % len(common_words)]] += 1
    counts.update((word, uncommon) for word in uncommon_words[:full])
    return counts


def _generate_cwe(tokenizer: TextTokenizer, target: int, rng: random.Random, task: str) -> Generated:
    preamble = (
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often."
    )
    question = f"Question: What are the {_CWE_COMMON} most common words in the above list?"
    answer_prefix = f" Answer: The top {_CWE_COMMON} words that appear most often in the list are:"
    vocabulary = list(cwe_words())
    rng.shuffle(vocabulary)
    common_words, uncommon_words = vocabulary[:_CWE_COMMON], vocabulary[_CWE_COMMON:]
    shuffle_seed = rng.getrandbits(64)

    word_tokens = dict(zip(vocabulary, piece_token_counts(tokenizer, [" " + w for w in vocabulary])))

    def numbers_source() -> Iterator[Batch]:
        for lo in itertools.count(1, 1024):
            texts = [f" {i}." for i in range(lo, lo + 1024)]
            yield texts, [True] * len(texts), None

    numbers = Units(tokenizer, numbers_source())
    fixed = count_tokens(tokenizer, preamble + "\n")

    def estimate(entries: int) -> float:
        counts = _cwe_counts(entries, common_words, uncommon_words)
        return fixed + numbers.tokens(entries) + sum(word_tokens[w] * c for w, c in counts.items())

    def largest_within(budget: float) -> int:
        if estimate(_CWE_MIN_ENTRIES) > budget:
            return _CWE_MIN_ENTRIES - 1
        lo, hi = _CWE_MIN_ENTRIES, 2 * _CWE_MIN_ENTRIES
        while estimate(hi) <= budget:
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # estimate(lo) <= budget < estimate(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if estimate(mid) <= budget else (lo, mid)
        return lo

    def render(entries: int) -> str:
        counts = _cwe_counts(entries, common_words, uncommon_words)
        listed = [word for word, c in counts.items() for _ in range(c)]
        random.Random(f"{shuffle_seed}:{entries}").shuffle(listed)
        return preamble + "\n" + " ".join(f"{i}. {word}" for i, word in enumerate(listed, 1))

    context, count = fit_context(tokenizer, target, task, estimate, largest_within, render, _CWE_MIN_ENTRIES)
    return context, count, question, tuple(common_words), answer_prefix


# Frequent words extraction

_FWE_ALPHA = 2.0  # Zipf exponent (RULER's default)
_FWE_ZETA = math.pi**2 / 6  # zeta(2): word k appears floor(N * k^-2 / zeta(2)) times
_FWE_NOISE = "...."  # rank 1, which the question says to ignore
_FWE_ANSWERS = 3
_FWE_WORD_LENGTH = 6
# With N >= 1 / (zeta-normalised gap between ranks 4 and 5) + 1 the third answer strictly outnumbers rank 5.
_FWE_MIN_WORDS = math.ceil(_FWE_ZETA / ((_FWE_ANSWERS + 1) ** -_FWE_ALPHA - (_FWE_ANSWERS + 2) ** -_FWE_ALPHA)) + 1


def _fwe_counts(total: int, vocabulary: int) -> list[int]:
    return [int(total * k**-_FWE_ALPHA / _FWE_ZETA) for k in range(1, vocabulary + 1)]


def _generate_fwe(tokenizer: TextTokenizer, target: int, rng: random.Random, task: str) -> Generated:
    preamble = (
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words."
    )
    question = (
        f"Question: Do not provide any explanation. Please ignore the dots '{_FWE_NOISE}'. "
        "What are the three most frequently appeared words in the above coded text?"
    )
    answer_prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
    # Word k gets a count only while N / (k^2 zeta(2)) >= 1; N <= 2 * target covers any tokenizer (a word is
    # at least one token) with room to spare.
    cap = 2 * target + _FWE_MIN_WORDS
    size = math.isqrt(int(cap / _FWE_ZETA)) + 2
    coded: list[str] = []
    seen: set[str] = set()
    while len(coded) < size - 1:
        word = "".join(rng.choices(string.ascii_lowercase, k=_FWE_WORD_LENGTH))
        if word not in seen:
            seen.add(word)
            coded.append(word)
    vocabulary = [_FWE_NOISE, *coded]
    answers = tuple(vocabulary[1 : 1 + _FWE_ANSWERS])
    shuffle_seed = rng.getrandbits(64)
    word_tokens = piece_token_counts(tokenizer, [" " + w for w in vocabulary])
    fixed = count_tokens(tokenizer, preamble + "\n")

    def estimate(total: int) -> float:
        return fixed + sum(t * c for t, c in zip(word_tokens, _fwe_counts(total, len(vocabulary))))

    def largest_within(budget: float) -> int:
        lo, hi = _FWE_MIN_WORDS - 1, cap
        if estimate(hi) <= budget:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if estimate(mid) <= budget else (lo, mid)
        return lo

    def render(total: int) -> str:
        listed = [w for w, c in zip(vocabulary, _fwe_counts(total, len(vocabulary))) for _ in range(c)]
        random.Random(f"{shuffle_seed}:{total}").shuffle(listed)
        return preamble + "\n" + " ".join(listed)

    context, count = fit_context(tokenizer, target, task, estimate, largest_within, render, _FWE_MIN_WORDS)
    return context, count, question, answers, answer_prefix


OTHER_TASKS: dict[str, tuple[Generator, int]] = {
    "vt": (_generate_vt, 64),
    "cwe": (_generate_cwe, 120),
    "fwe": (_generate_fwe, 50),
}


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


def generate_niah(spec: _Niah, tokenizer: TextTokenizer, target: int, rng: random.Random, task: str) -> Generated:
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


TASKS: tuple[str, ...] = (*NIAH_TASKS, *OTHER_TASKS)


def generate(task: str, tokenizer: TextTokenizer, context_tokens: int, seed: int) -> SyntheticSample:
    """One sample of ``task`` whose context has at most (and close to) ``context_tokens`` tokens.

    Everything is drawn from ``seed``: the same arguments always give the same sample.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are: {', '.join(TASKS)}")
    check_int("context_tokens", context_tokens, 1)
    check_int("seed", seed, -(2**63))
    rng = random.Random(f"ripplekv.ruler:{task}:{seed}")
    if task in NIAH_TASKS:
        spec = NIAH_TASKS[task]
        context, count, question, answers, prefix = generate_niah(spec, tokenizer, context_tokens, rng, task)
        max_new_tokens = spec.max_new_tokens
    else:
        generator, max_new_tokens = OTHER_TASKS[task]
        context, count, question, answers, prefix = generator(tokenizer, context_tokens, rng, task)
    return SyntheticSample(task, context, question, answers, count, seed, max_new_tokens, prefix)


def _sample_seed(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def generate_suite(
    tokenizer: TextTokenizer,
    context_tokens: int,
    samples_per_task: int,
    seed: int = 0,
    tasks: Sequence[str] | None = None,
) -> list[SyntheticSample]:
    """``samples_per_task`` samples of each task (all of :data:`TASKS` by default), grouped by task.

    Sample ``j``'s seed derives from ``(seed, j)`` and is stored in ``sample.seed``, so
    ``generate(sample.task, tokenizer, context_tokens, sample.seed)`` rebuilds it.
    """
    check_int("samples_per_task", samples_per_task, 1)
    check_int("seed", seed, -(2**63))
    names = list(TASKS if tasks is None else tasks)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; tasks are: {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"tasks contains duplicates: {names}")
    seeds = [_sample_seed(seed, j) for j in range(samples_per_task)]
    return [generate(name, tokenizer, context_tokens, s) for name in names for s in seeds]


_CONTROL = re.compile(r"[\x00-\x1f]")


def score(prediction: str, answers: Sequence[str]) -> float:
    """RULER's ``string_match_all``: the fraction of ``answers`` found in the prediction, case-insensitively, after
    RULER's post-processing (control characters become newlines, whitespace stripped)."""
    if not answers:
        raise ValueError("answers must not be empty")
    text = _CONTROL.sub("\n", prediction).strip().lower()
    return sum(1.0 if str(reference).lower() in text else 0.0 for reference in answers) / len(answers)
