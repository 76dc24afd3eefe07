"""RULER-style synthetic long-context tasks, generated locally from a seed and scored by string match.

The task families follow RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"): needle retrieval in several flavours, variable tracking, common-words extraction and
frequent-words extraction. Nothing is downloaded: the essay haystack is the Paul Graham collection read by
:mod:`ripplekv.profiling.haystack`, every other text is built here from a seeded :class:`random.Random`.

Every context is sized in tokens of the tokenizer it is generated for: it never exceeds ``context_tokens`` and
normally lands within 2% of it. Filler pieces (haystack words or sentences, list entries, coded words) are
tokenized once, their counts summed to pick a size, and the whole context is tokenized only to confirm (and, where
seams between pieces tokenize differently, correct) that choice, a few times at most.

Prompt layout (as in RULER, split where the question starts)::

    context:  <task instruction>\\n<haystack / list / coded text>
    question: <the query>
    answer_prefix: <RULER's answer prefix, for base models; optional>

:meth:`SyntheticSample.prompt` joins them. Scoring is RULER's ``string_match_all`` / ``string_match_part``
(:func:`score`); every task here uses ``"all"``, as RULER does for its synthetic tasks.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ripplekv.profiling.haystack import TextTokenizer, encode, essays

__all__ = ["METRICS", "TASKS", "SyntheticSample", "generate", "generate_suite", "score"]

METRICS = ("all", "part")


@dataclass(frozen=True)
class SyntheticSample:
    task: str  # e.g. "niah_single_essay_number"
    context: str  # the long text: task instruction, then haystack with needles / variable chains / word list
    question: str  # the query, asked after the context
    answers: tuple[str, ...]
    metric: str  # "all" (every answer must appear in the prediction) or "part" (any)
    context_tokens: int  # token count of ``context``, measured with the tokenizer that built it
    seed: int
    max_new_tokens: int
    answer_prefix: str = ""  # RULER's answer prefix (starts with a space), for prompting base models

    def prompt(self, with_answer_prefix: bool = False) -> str:
        """Context, a newline, the question (and, when asked, the answer prefix right after it)."""
        suffix = self.answer_prefix if with_answer_prefix else ""
        return f"{self.context}\n{self.question}{suffix}"


# ---------------------------------------------------------------------------------------------------------
# Word lists (written for this module). Lists are made substring-free at first use (a word that occurs inside
# another word of the same list is dropped), so one answer can never be matched by printing a different word.
# ---------------------------------------------------------------------------------------------------------

_ADJECTIVES_TEXT = """
ancient angry bitter blazing bouncy brave breezy bright brisk bumpy calm careful cheerful chilly clever cloudy clumsy
cozy crimson crisp crooked curious damp daring dazzling delicate dizzy dusty eager elegant empty fancy fierce fluffy
foggy fragile frosty fuzzy gentle giant gloomy golden graceful grumpy hasty heavy hidden hollow humble hungry jolly
lazy lively lonely lucky mellow merry mighty misty modern muddy narrow noisy odd polite proud purple quick quiet rapid
rocky rough rusty sandy scarlet shaggy shiny silent silky sleepy slender slimy smooth sneaky snowy soft sour
sparkling spicy steady sticky stormy sturdy sunny swift tame tender thirsty tidy tiny velvet vivid wandering wary wild
windy wise witty wobbly wooden young zealous
"""

_NOUNS_TEXT = """
anchor apple badger balloon bamboo banana basket beacon beetle blanket blossom bottle bracelet bridge bucket butter
cabin cactus camel candle canoe canyon carpet carrot castle cherry chimney compass cookie copper cottage crayon
cricket crystal cupboard curtain daisy dolphin dragon drum eagle engine falcon feather fiddle forest fountain fox
garden giraffe glacier goblet gravel guitar hammer harbor hedgehog helmet honey island jacket jaguar jungle kettle
kitten ladder lantern lemon lizard lobster magnet mango maple meadow mirror monkey mountain mushroom orchid otter
paddle panda parrot peach pebble pencil penguin pepper piano pillow pirate planet pocket pony pumpkin puzzle quilt
rabbit raccoon radish raven ribbon river robot rocket saddle salmon sandal saxophone scarf shovel spider spoon
squirrel statue sunflower teapot thimble tiger tomato tractor trumpet tulip turtle umbrella valley violin volcano
wagon walnut walrus whistle willow window wizard zebra acorn almond anvil apricot avocado biscuit blender buffalo
cabbage camera caravan cello cinnamon coconut cobra donkey emerald ferret flamingo gazelle glove hamster harp igloo
kayak koala lagoon llama mitten moose nectar noodle octopus olive owl pelican pickle pinecone porcupine quartz
reindeer rhino satchel scooter seashell sparrow sponge starfish strawberry tadpole tortoise toucan trolley tuba
unicorn vulture waffle yacht yogurt
"""

_VERBS_TEXT = """
accept admire arrive bake borrow breathe build carry chase climb collect cook crawl dance deliver describe dig
discover drift explore fold gather giggle glide grow hunt imagine invent juggle jump knit laugh listen march measure
melt mumble notice observe paint pedal plant polish pour pretend ramble repair rescue scatter search sew shiver sing
skip sketch slide sneeze splash sprint squeeze stir stretch swim swing tickle travel tumble twist unpack vanish visit
wash whisper wiggle wonder worry wrap yawn yell
"""


def _substring_free(words: Sequence[str]) -> tuple[str, ...]:
    unique = list(dict.fromkeys(words))
    return tuple(w for w in unique if not any(w != other and w in other for other in unique))


@functools.cache
def _adjectives() -> tuple[str, ...]:
    return _substring_free(_ADJECTIVES_TEXT.split())


@functools.cache
def _nouns() -> tuple[str, ...]:
    return _substring_free(_NOUNS_TEXT.split())


@functools.cache
def _cwe_words() -> tuple[str, ...]:
    return _substring_free(_ADJECTIVES_TEXT.split() + _NOUNS_TEXT.split() + _VERBS_TEXT.split())


# ---------------------------------------------------------------------------------------------------------
# Token accounting
# ---------------------------------------------------------------------------------------------------------

_FIT_TOLERANCE = 0.02  # stop refining once the context is within 2% below the target
_MAX_FIT_ROUNDS = 12  # full tokenizations at most per sample (typically 1-3)
_MIN_HAYSTACK_TOKENS = 32


def _piece_token_counts(tokenizer: TextTokenizer, pieces: Sequence[str]) -> list[int]:
    """Tokens of each piece as it tokenizes inside ``"".join(pieces)``.

    Fast tokenizers report character offsets, so the joined text is tokenized once and every token is credited
    to the piece its first character lies in (the counts then sum to the joined text's token count exactly).
    Without offsets (slow tokenizers) each piece is tokenized on its own.
    """
    if not pieces:
        return []
    offsets = None
    try:
        options = {"add_special_tokens": False, "verbose": False, "return_offsets_mapping": True}
        encoded = tokenizer("".join(pieces), **options)
        offsets = encoded["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError, ValueError):
        offsets = None
    if offsets is None:
        return [len(encode(tokenizer, piece)) for piece in pieces]
    if hasattr(offsets, "tolist"):
        offsets = offsets.tolist()
    ends = list(itertools.accumulate(len(piece) for piece in pieces))
    counts = [0] * len(pieces)
    last = len(pieces) - 1
    for start, _ in offsets:
        counts[min(bisect.bisect_right(ends, start), last)] += 1
    return counts


def _count(tokenizer: TextTokenizer, text: str) -> int:
    return len(encode(tokenizer, text))


# A batch of filler units: their texts (each but a haystack's first begins with whitespace), whether a needle may
# be inserted right before each, and optionally their token counts (computed from the texts when None).
_Batch = tuple[list[str], list[bool], list[int] | None]


class _Units:
    """A lazily grown sequence of filler units with prefix sums of their token counts."""

    def __init__(self, tokenizer: TextTokenizer, source: Iterator[_Batch]) -> None:
        self._tokenizer = tokenizer
        self._source = source
        self.units: list[str] = []
        self.prefix: list[int] = [0]
        self._breaks: list[int] = [0]  # unit indices a needle may be inserted before (sorted)

    def _grow(self) -> None:
        texts, breakable, counts = next(self._source)
        if counts is None:
            counts = _piece_token_counts(self._tokenizer, texts)
        base = len(self.units)
        self.units.extend(texts)
        for i, (count, ok) in enumerate(zip(counts, breakable)):
            self.prefix.append(self.prefix[-1] + count)
            if ok and base + i > 0:
                self._breaks.append(base + i)

    def ensure_tokens(self, tokens: float) -> None:
        while self.prefix[-1] < tokens:
            self._grow()

    def ensure_units(self, n: int) -> None:
        while len(self.units) < n:
            self._grow()

    def tokens(self, n: int) -> int:
        self.ensure_units(n)
        return self.prefix[n]

    def largest_within(self, budget: float) -> int:
        """The most units whose summed token counts stay within ``budget`` (-1 when the budget is negative)."""
        if budget < 0:
            return -1
        self.ensure_tokens(budget + 1)
        return bisect.bisect_right(self.prefix, budget) - 1

    def smallest_with(self, tokens: float) -> int:
        self.ensure_tokens(tokens)
        return bisect.bisect_left(self.prefix, tokens)

    def insertion_point(self, fraction: float, n: int) -> int:
        """The allowed insertion point (0, a break before a unit < n, or n) nearest ``fraction * n``."""
        goal = fraction * n
        candidates = {0, n}
        i = bisect.bisect_left(self._breaks, goal)
        for j in (i - 1, i):
            if 0 <= j < len(self._breaks) and self._breaks[j] <= n:
                candidates.add(self._breaks[j])
        return min(candidates, key=lambda c: (abs(c - goal), c))

    def text(self, n: int, inserts: Sequence[tuple[int, float, str]] = ()) -> str:
        """The first ``n`` units with ``(position, order, text)`` inserts placed before unit ``position``."""
        self.ensure_units(n)
        pieces: list[str] = []
        cursor = 0
        for position, _, inserted in sorted(inserts, key=lambda item: (item[0], item[1])):
            pieces.extend(self.units[cursor:position])
            pieces.append(" " + inserted)
            cursor = max(cursor, position)
        pieces.extend(self.units[cursor:n])
        return "".join(pieces).strip()


def _fit(
    tokenizer: TextTokenizer,
    target: int,
    task: str,
    estimate: Callable[[int], float],
    largest_within: Callable[[float], int],
    render: Callable[[int], str],
    min_n: int,
) -> tuple[str, int]:
    """Pick the size parameter ``n`` whose rendered text has the most tokens not above ``target``.

    ``estimate(n)`` predicts the token count of ``render(n)`` (non-decreasing in ``n``) and ``largest_within(b)``
    is the largest ``n`` with ``estimate(n) <= b``. Each round tokenizes one rendered text, rescales the estimate
    by the measured/estimated ratio and tries again inside the bracket of sizes known to fit / not to fit.
    """
    best: tuple[int, str, int] | None = None
    over: int | None = None
    n = max(min_n, largest_within(target))
    for _ in range(_MAX_FIT_ROUNDS):
        text = render(n)
        count = _count(tokenizer, text)
        if count <= target:
            if best is None or n > best[0]:
                best = (n, text, count)
            if count >= target * (1.0 - _FIT_TOLERANCE):
                break
        else:
            over = n if over is None else min(over, n)
            if n <= min_n:
                break
        ratio = count / max(estimate(n), 1.0)
        guess = largest_within(target / ratio)
        low = best[0] if best is not None else min_n - 1
        guess = max(guess, low + 1)
        if over is not None and guess >= over:
            guess = (low + over) // 2
        if guess <= low:
            break
        n = guess
    if best is None:
        needed = _count(tokenizer, render(min_n))
        raise ValueError(
            f"context_tokens={target} is too small for task {task!r}: its smallest context has {needed} tokens "
            f"with this tokenizer (use context_tokens >= {needed})"
        )
    return best[1], best[2]


# ---------------------------------------------------------------------------------------------------------
# Haystacks
# ---------------------------------------------------------------------------------------------------------

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_NOISE_SENTENCES = tuple(" " + sentence.strip() for sentence in re.findall(r"[^.]+\.", NOISE))
_NOISE_REPEATS_PER_BATCH = 64
_ESSAY_WORDS_PER_BATCH = 512
_NEEDLES_PER_BATCH = 32
_WORD = re.compile(r"\s*\S+")
_ENDS_SENTENCE = re.compile(r"[.!?][\"')\]]?$")
_STARTS_SENTENCE = re.compile(r"[\"'(\[]?[A-Z0-9]")


def _noise_source(tokenizer: TextTokenizer) -> Iterator[_Batch]:
    """RULER's repeated noise paragraph; needles go only between whole repeats."""
    texts = list(_NOISE_SENTENCES) * _NOISE_REPEATS_PER_BATCH
    breakable = ([True] + [False] * (len(_NOISE_SENTENCES) - 1)) * _NOISE_REPEATS_PER_BATCH
    counts = _piece_token_counts(tokenizer, texts)  # every batch is the same text: tokenized once
    while True:
        yield list(texts), list(breakable), list(counts)


@functools.cache
def _essay_words(index: int) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """Words of one essay with their leading whitespace, and whether a sentence starts at each."""
    text = essays()[index][1]
    words = _WORD.findall(text)
    if not words:
        return (), ()
    words[0] = "\n\n" + words[0].lstrip()  # essays are separated by a blank line
    breakable = [True]
    for previous, word in zip(words, words[1:]):
        # A sentence starts after . ! or ? when the next word is capitalised ("e.g. gossip" goes on); the essays
        # are hard-wrapped, so a single newline is no break, a blank line (new paragraph) is.
        stripped = word.lstrip()
        starts = bool(_ENDS_SENTENCE.search(previous)) and _STARTS_SENTENCE.match(stripped) is not None
        breakable.append(starts or "\n\n" in word[: len(word) - len(stripped)])
    return tuple(words), tuple(breakable)


def _essay_source(start: int) -> Iterator[_Batch]:
    """Essay words from essay ``start`` on (cycling through the sorted collection), a needle only at sentence
    starts."""
    total = len(essays())
    for offset in itertools.count():
        words, breakable = _essay_words((start + offset) % total)
        for lo in range(0, len(words), _ESSAY_WORDS_PER_BATCH):
            hi = lo + _ESSAY_WORDS_PER_BATCH
            yield list(words[lo:hi]), list(breakable[lo:hi]), None


def _needle_source(make_needle: Callable[[], str]) -> Iterator[_Batch]:
    """A haystack made of distractor needles (RULER's ``needle`` haystack).

    The units are words, so the haystack can end inside its last distractor (as text haystacks end inside a
    sentence) and the context still lands close to its token target; real needles go between distractors.
    """
    while True:
        texts: list[str] = []
        breakable: list[bool] = []
        for _ in range(_NEEDLES_PER_BATCH):
            words = _WORD.findall(" " + make_needle())
            texts.extend(words)
            breakable.extend([True] + [False] * (len(words) - 1))
        yield texts, breakable, None


# ---------------------------------------------------------------------------------------------------------
# Needle in a haystack
# ---------------------------------------------------------------------------------------------------------

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


_NIAH_TASKS: dict[str, _Niah] = {
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
    nouns = _nouns()
    return f"{_adjectives()[index // len(nouns)]}-{nouns[index % len(nouns)]}"


def _draw_keys(rng: random.Random, count: int, key_type: str) -> list[str]:
    if key_type == "uuid":
        return [_random_uuid(rng) for _ in range(count)]
    return [_word_key(i) for i in rng.sample(range(len(_adjectives()) * len(_nouns())), count)]


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
    indices = list(range(len(_adjectives()) * len(_nouns())))
    while True:  # every key once before any repeats
        rng.shuffle(indices)
        for index in indices:
            key = _word_key(index)
            if key not in exclude:
                yield key


def _generate_niah(
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
        units = _Units(tokenizer, _noise_source(tokenizer))
    elif spec.haystack == "essay":
        units = _Units(tokenizer, _essay_source(rng.randrange(len(essays()))))
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
        words = [w for w in _nouns() if w not in forbidden]
        if len(words) < spec.keys * spec.values:
            words = [w for w in _nouns() if not any(w in key for key in keys)]
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
        units = _Units(tokenizer, _needle_source(lambda: needle(next(filler_keys), filler_value())))

    hay = units
    fixed = sum(_piece_token_counts(tokenizer, [preamble + "\n", *(" " + text for text in needles)]))

    def render(n: int) -> str:
        inserts = [(hay.insertion_point(depth, n), depth, text) for depth, text in zip(depths, needles)]
        return f"{preamble}\n{hay.text(n, inserts)}"

    context, count = _fit(
        tokenizer,
        target,
        task,
        estimate=lambda n: fixed + hay.tokens(n),
        largest_within=lambda budget: hay.largest_within(budget - fixed),
        render=render,
        min_n=max(1, hay.smallest_with(_MIN_HAYSTACK_TOKENS)),
    )
    return context, count, question, answers, answer_prefix


# ---------------------------------------------------------------------------------------------------------
# Variable tracking
# ---------------------------------------------------------------------------------------------------------

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

    hay = _Units(tokenizer, _noise_source(tokenizer))
    fixed = sum(_piece_token_counts(tokenizer, [preamble + "\n", *(" " + text for _, text in statements)]))

    def render(n: int) -> str:
        inserts = [(hay.insertion_point(position, n), position, text) for position, text in statements]
        return f"{preamble}\n{hay.text(n, inserts)}"

    context, count = _fit(
        tokenizer,
        target,
        task,
        estimate=lambda n: fixed + hay.tokens(n),
        largest_within=lambda budget: hay.largest_within(budget - fixed),
        render=render,
        min_n=max(1, hay.smallest_with(_MIN_HAYSTACK_TOKENS)),
    )
    return context, count, question, answers, answer_prefix


# ---------------------------------------------------------------------------------------------------------
# Common words extraction
# ---------------------------------------------------------------------------------------------------------

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
    vocabulary = list(_cwe_words())
    rng.shuffle(vocabulary)
    common_words, uncommon_words = vocabulary[:_CWE_COMMON], vocabulary[_CWE_COMMON:]
    shuffle_seed = rng.getrandbits(64)

    word_tokens = dict(zip(vocabulary, _piece_token_counts(tokenizer, [" " + w for w in vocabulary])))

    def numbers_source() -> Iterator[_Batch]:
        for lo in itertools.count(1, 1024):
            texts = [f" {i}." for i in range(lo, lo + 1024)]
            yield texts, [True] * len(texts), None

    numbers = _Units(tokenizer, numbers_source())
    fixed = _count(tokenizer, preamble + "\n")

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

    context, count = _fit(tokenizer, target, task, estimate, largest_within, render, _CWE_MIN_ENTRIES)
    return context, count, question, tuple(common_words), answer_prefix


# ---------------------------------------------------------------------------------------------------------
# Frequent words extraction
# ---------------------------------------------------------------------------------------------------------

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
    word_tokens = _piece_token_counts(tokenizer, [" " + w for w in vocabulary])
    fixed = _count(tokenizer, preamble + "\n")

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

    context, count = _fit(tokenizer, target, task, estimate, largest_within, render, _FWE_MIN_WORDS)
    return context, count, question, answers, answer_prefix


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------

_OTHER_TASKS: dict[str, tuple[Callable[..., tuple[str, int, str, tuple[str, ...], str]], int]] = {
    "vt": (_generate_vt, 64),
    "cwe": (_generate_cwe, 120),
    "fwe": (_generate_fwe, 50),
}

TASKS: tuple[str, ...] = (*_NIAH_TASKS, *_OTHER_TASKS)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def generate(task: str, tokenizer: TextTokenizer, context_tokens: int, seed: int) -> SyntheticSample:
    """One sample of ``task`` whose context has at most (and close to) ``context_tokens`` tokens.

    Everything (needle keys and values, depths, haystack start, word lists) is drawn from ``seed``, so the same
    arguments always give the same sample. Raises ``ValueError`` for an unknown task or a context too small
    for the task's fixed parts.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are: {', '.join(TASKS)}")
    _check_int("context_tokens", context_tokens, 1)
    _check_int("seed", seed, -(2**63))
    rng = random.Random(f"ripplekv.ruler:{task}:{seed}")
    if task in _NIAH_TASKS:
        spec = _NIAH_TASKS[task]
        context, count, question, answers, prefix = _generate_niah(spec, tokenizer, context_tokens, rng, task)
        max_new_tokens = spec.max_new_tokens
    else:
        generator, max_new_tokens = _OTHER_TASKS[task]
        context, count, question, answers, prefix = generator(tokenizer, context_tokens, rng, task)
    return SyntheticSample(
        task=task,
        context=context,
        question=question,
        answers=answers,
        metric="all",
        context_tokens=count,
        seed=seed,
        max_new_tokens=max_new_tokens,
        answer_prefix=prefix,
    )


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

    Sample ``j`` of a task gets a seed derived from ``(seed, j)`` (stored in ``sample.seed``, so
    ``generate(sample.task, tokenizer, context_tokens, sample.seed)`` rebuilds it).
    """
    _check_int("samples_per_task", samples_per_task, 1)
    _check_int("seed", seed, -(2**63))
    if isinstance(tasks, str):
        raise ValueError(f"tasks must be a sequence of task names, not the string {tasks!r}")
    names = list(TASKS if tasks is None else tasks)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; tasks are: {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"tasks contains duplicates: {names}")
    seeds = [_sample_seed(seed, j) for j in range(samples_per_task)]
    return [generate(name, tokenizer, context_tokens, s) for name in names for s in seeds]


_CONTROL = re.compile(r"[\x00-\x1f]")


def score(
    sample_or_metric: SyntheticSample | str, prediction: str, answers: Sequence[str] | str | None = None
) -> float:
    """RULER's string match for one prediction, in [0, 1].

    ``"all"`` (``string_match_all``): the fraction of answers that occur in the prediction; ``"part"``
    (``string_match_part``): 1.0 when any answer occurs. Matching is case-insensitive substring search after
    RULER's post-processing (control characters become newlines, surrounding whitespace is stripped). Given a
    sample, its metric is used, and its answers unless ``answers`` is passed.
    """
    if isinstance(sample_or_metric, SyntheticSample):
        metric = sample_or_metric.metric
        if answers is None:
            answers = sample_or_metric.answers
    elif isinstance(sample_or_metric, str):
        metric = sample_or_metric
    else:
        raise ValueError(f"expected a SyntheticSample or a metric name, got {type(sample_or_metric).__name__}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    if answers is None:
        raise ValueError("answers are required when scoring with a metric name")
    if not isinstance(prediction, str):
        raise ValueError(f"prediction must be a string, got {type(prediction).__name__}")
    references = (answers,) if isinstance(answers, str) else tuple(answers)
    if not references:
        raise ValueError("answers must not be empty")
    text = _CONTROL.sub("\n", prediction).strip().lower()
    hits = [1.0 if str(reference).lower() in text else 0.0 for reference in references]
    return sum(hits) / len(hits) if metric == "all" else max(hits)
