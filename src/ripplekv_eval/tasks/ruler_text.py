"""Filler text for the RULER-style tasks (:mod:`ripplekv_eval.tasks.ruler`): word lists, haystacks, token accounting.

A context never exceeds its token target and normally lands within 2% of it. Filler pieces are tokenized once and
their counts summed to pick a size (:class:`Units`); the whole context is tokenized only to confirm (or, where seams
between pieces tokenize differently, correct) that choice, a few times at most (:func:`fit_context`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Sequence

from ripplekv.profiling.haystack import TextTokenizer, encode, essays

# Word lists (written for this module), made substring-free at first use (a word inside another word of the same
# list is dropped), so one answer can never be matched by printing a different word.

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
def adjective_words() -> tuple[str, ...]:
    return _substring_free(_ADJECTIVES_TEXT.split())


@functools.cache
def noun_words() -> tuple[str, ...]:
    return _substring_free(_NOUNS_TEXT.split())


@functools.cache
def cwe_words() -> tuple[str, ...]:
    return _substring_free(_ADJECTIVES_TEXT.split() + _NOUNS_TEXT.split() + _VERBS_TEXT.split())


# Token accounting

_FIT_TOLERANCE = 0.02  # stop refining once the context is within 2% below the target
_MAX_FIT_ROUNDS = 12  # full tokenizations at most per sample (typically 1-3)
MIN_HAYSTACK_TOKENS = 32


def piece_token_counts(tokenizer: TextTokenizer, pieces: Sequence[str]) -> list[int]:
    """Tokens of each piece as it tokenizes inside ``"".join(pieces)``.

    Fast tokenizers report character offsets, so the joined text is tokenized once and every token is credited
    to the piece its first character lies in (the counts then sum to the joined text's token count exactly).
    Without offsets (slow tokenizers) each piece is tokenized on its own.
    """
    if not pieces:
        return []
    try:
        options = {"add_special_tokens": False, "verbose": False, "return_offsets_mapping": True}
        offsets = tokenizer("".join(pieces), **options)["offset_mapping"]
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


def count_tokens(tokenizer: TextTokenizer, text: str) -> int:
    return len(encode(tokenizer, text))


# A batch of filler units: their texts (each but a haystack's first begins with whitespace), whether a needle may
# be inserted right before each, and optionally their token counts (computed from the texts when None).
Batch = tuple[list[str], list[bool], list[int] | None]


class Units:
    """A lazily grown sequence of filler units with prefix sums of their token counts."""

    def __init__(self, tokenizer: TextTokenizer, source: Iterator[Batch]) -> None:
        self._tokenizer = tokenizer
        self._source = source
        self.units: list[str] = []
        self.prefix: list[int] = [0]
        self._breaks: list[int] = [0]  # unit indices a needle may be inserted before (sorted)

    def _grow(self) -> None:
        texts, breakable, counts = next(self._source)
        if counts is None:
            counts = piece_token_counts(self._tokenizer, texts)
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


def fit_context(
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
        count = count_tokens(tokenizer, text)
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
        needed = count_tokens(tokenizer, render(min_n))
        raise ValueError(
            f"context_tokens={target} is too small for task {task!r}: its smallest context has {needed} tokens "
            f"with this tokenizer (use context_tokens >= {needed})"
        )
    return best[1], best[2]


def fit_with_inserts(
    tokenizer: TextTokenizer,
    target: int,
    task: str,
    hay: Units,
    preamble: str,
    placed: list[tuple[float, str]],
) -> tuple[str, int]:
    """The preamble and as much of ``hay`` as fits ``target`` tokens, each ``(depth, text)`` inserted at its
    relative depth in the filler (``task`` names the task in the error when even the smallest context is too long).
    """
    fixed = sum(piece_token_counts(tokenizer, [preamble + "\n", *(" " + text for _, text in placed)]))

    def render(n: int) -> str:
        inserts = [(hay.insertion_point(depth, n), depth, text) for depth, text in placed]
        return f"{preamble}\n{hay.text(n, inserts)}"

    return fit_context(
        tokenizer,
        target,
        task,
        estimate=lambda n: fixed + hay.tokens(n),
        largest_within=lambda budget: hay.largest_within(budget - fixed),
        render=render,
        min_n=max(1, hay.smallest_with(MIN_HAYSTACK_TOKENS)),
    )


# Haystacks

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_NOISE_SENTENCES = tuple(" " + sentence.strip() for sentence in re.findall(r"[^.]+\.", NOISE))
_NOISE_REPEATS_PER_BATCH = 64
_ESSAY_WORDS_PER_BATCH = 512
_NEEDLES_PER_BATCH = 32
WORD_PATTERN = re.compile(r"\s*\S+")
_ENDS_SENTENCE = re.compile(r"[.!?][\"')\]]?$")
_STARTS_SENTENCE = re.compile(r"[\"'(\[]?[A-Z0-9]")


def noise_source(tokenizer: TextTokenizer) -> Iterator[Batch]:
    """RULER's repeated noise paragraph; needles go only between whole repeats."""
    texts = list(_NOISE_SENTENCES) * _NOISE_REPEATS_PER_BATCH
    breakable = ([True] + [False] * (len(_NOISE_SENTENCES) - 1)) * _NOISE_REPEATS_PER_BATCH
    counts = piece_token_counts(tokenizer, texts)  # every batch is the same text: tokenized once
    while True:
        yield list(texts), list(breakable), list(counts)


@functools.cache
def _essay_words(index: int) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """Words of one essay with their leading whitespace, and whether a sentence starts at each."""
    text = essays()[index][1]
    words = WORD_PATTERN.findall(text)
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


def essay_source(start: int) -> Iterator[Batch]:
    """Essay words from essay ``start`` on (cycling through the collection), a needle only at sentence starts."""
    total = len(essays())
    for offset in itertools.count():
        words, breakable = _essay_words((start + offset) % total)
        for lo in range(0, len(words), _ESSAY_WORDS_PER_BATCH):
            hi = lo + _ESSAY_WORDS_PER_BATCH
            yield list(words[lo:hi]), list(breakable[lo:hi]), None


def needle_source(make_needle: Callable[[], str]) -> Iterator[Batch]:
    """A haystack made of distractor needles (RULER's ``needle`` haystack).

    The units are words, so the haystack can end inside its last distractor (as text haystacks end inside a
    sentence) and the context still lands close to its token target; real needles go between distractors.
    """
    while True:
        texts: list[str] = []
        breakable: list[bool] = []
        for _ in range(_NEEDLES_PER_BATCH):
            words = WORD_PATTERN.findall(" " + make_needle())
            texts.extend(words)
            breakable.extend([True] + [False] * (len(words) - 1))
        yield texts, breakable, None
