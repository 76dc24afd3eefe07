"""The RULER-style tasks other than needle retrieval (:mod:`ripplekv_eval.tasks.ruler`): variable tracking,
common-words and frequent-words extraction; :data:`OTHER_TASKS` maps each to its :data:`Generator` and answer length.
"""

from __future__ import annotations

import itertools
import math
import random
import string
from collections.abc import Callable, Iterator, Sequence

from ripplekv.profiling.haystack import TextTokenizer
from ripplekv_eval.tasks.ruler_text import (
    NOISE,
    Batch,
    Units,
    count_tokens,
    cwe_words,
    fit_context,
    fit_with_inserts,
    noise_source,
    piece_token_counts,
)

__all__ = ["OTHER_TASKS", "Generator"]

Generator = Callable[..., tuple[str, int, str, tuple[str, ...], str]]
"""``(tokenizer, target, rng, task) -> (context, context_tokens, question, answers, answer_prefix)``."""


# Variable tracking

_VT_CHAINS = 1  # RULER's defaults
_VT_HOPS = 4
_VT_NAME_LENGTH = 5


def _generate_vt(
    tokenizer: TextTokenizer, target: int, rng: random.Random, task: str
) -> tuple[str, int, str, tuple[str, ...], str]:
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


def _generate_cwe(
    tokenizer: TextTokenizer, target: int, rng: random.Random, task: str
) -> tuple[str, int, str, tuple[str, ...], str]:
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


def _generate_fwe(
    tokenizer: TextTokenizer, target: int, rng: random.Random, task: str
) -> tuple[str, int, str, tuple[str, ...], str]:
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
