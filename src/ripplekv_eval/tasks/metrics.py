"""The official LongBench v1 metrics (THUDM/LongBench ``metrics.py``), English tasks, quirks included.

Each metric scores one prediction against ONE ground-truth answer, ``metric(prediction, ground_truth,
all_classes=None) -> float``; a sample scores the max over its answers
(:func:`ripplekv_eval.tasks.longbench.score_record`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher

Metric = Callable[..., float]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"\d+")
_PARAGRAPH = re.compile(r"Paragraph (\d+)")


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, replace the articles a/an/the by a space, collapse whitespace (SQuAD)."""
    lowered = text.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def _token_f1(prediction_tokens: Sequence[str], ground_truth_tokens: Sequence[str]) -> float:
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Token-level F1 between the normalized prediction and ground truth (bag of words, with multiplicity)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """ROUGE-L F from the ``rouge==1.0.1`` package; 0.0 where that package raises.

    The official code's bare ``except`` becomes ``except Exception``: it covers ValueError (empty text),
    ZeroDivisionError (whitespace-only text) and RecursionError (very long sentences), not KeyboardInterrupt.
    """
    from rouge import Rouge  # imported lazily: only the summarization tasks need it

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:
        return 0.0
    return float(scores["rouge-l"]["f"])


def classification_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Official trec/lsht score: 1/k when the ground truth is among the k class names found in the prediction.

    Found names (sub-strings, in ``all_classes`` order) that are a strict sub-string of the ground truth are dropped,
    with the official loop's quirk: the list is mutated while walked, so the element after a dropped one stays. The
    official ``difflib`` fallback is unreachable (``em_match_list != 0`` is always true): no class name found is 0.0.
    """
    if all_classes is None:
        raise ValueError("classification_score needs all_classes (the task's list of class names)")
    matched = [name for name in all_classes if name in prediction]
    # Walk the list by index exactly as a Python list iterator does while the loop body removes items.
    index = 0
    while index < len(matched):
        term = matched[index]
        if term in ground_truth and term != ground_truth:
            matched.remove(term)
        index += 1
    return 1.0 / len(matched) if ground_truth in matched else 0.0


def _fraction_equal(prediction: str, target: str) -> float:
    numbers = _NUMBER.findall(prediction)
    return sum(1 for number in numbers if number == target) / len(numbers) if numbers else 0.0


def count_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Fraction of the numbers (``\\d+`` runs) in the prediction that equal the ground truth; 0.0 with no number."""
    return _fraction_equal(prediction, str(ground_truth))


def retrieval_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Fraction of the numbers in the prediction equal to N, where the ground truth reads ``Paragraph N``."""
    match = _PARAGRAPH.search(ground_truth)
    if match is None:
        raise ValueError(f"retrieval_score: the ground truth {ground_truth!r} has no 'Paragraph <number>'")
    return _fraction_equal(prediction, match.group(1))


def fuzz_ratio(first: str, second: str) -> int:
    """``fuzzywuzzy.fuzz.ratio`` (0.18.0, pure-Python backend): ``round(100 * SequenceMatcher.ratio())``.

    The official environment has no python-Levenshtein; with it (or rapidfuzz) the scores differ on 85 of 403 pairs
    built from LongBench's code answers, hence this reimplementation. Equal strings score 100 (even two empty ones),
    an empty against a non-empty one 0; ``round`` is half to even, as fuzzywuzzy's ``utils.intr``.
    """
    if first == second:
        return 100
    if not first or not second:
        return 0
    return int(round(100 * SequenceMatcher(None, first, second).ratio()))


def code_sim_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """``fuzz_ratio / 100`` between the ground truth and the first prediction line free of a backtick, ``#``, ``//``.

    As officially: leading newlines dropped, a line CONTAINING any of them (not only starting with one) skipped; no
    such line counts as the empty string.
    """
    first_code_line = ""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            first_code_line = line
            break
    return fuzz_ratio(first_code_line, ground_truth) / 100


METRICS: dict[str, Metric] = {
    "qa_f1_score": qa_f1_score,
    "rouge_score": rouge_score,
    "classification_score": classification_score,
    "count_score": count_score,
    "retrieval_score": retrieval_score,
    "code_sim_score": code_sim_score,
}
"""Metric name (as in the official ``eval.py``) -> function."""
