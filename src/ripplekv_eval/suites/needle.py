"""The needle suite: a number hidden in essay text (:func:`ripplekv.profiling.haystack.build_needle_prompt`) over
context lengths x depths; a prediction scores 1 when it holds the number as a whole number (also the gold answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ripplekv.profiling.haystack import NeedlePrompt, build_needle_prompt
from ripplekv_eval.sample import EvalSample, positive_int
from ripplekv_eval.suites.base import Suite, SuiteRequest, cap_new_tokens, prompt_parts, split_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


__all__ = [
    "DEFAULT_NEEDLE_DEPTHS",
    "DEFAULT_NEEDLE_DIGITS",
    "DEFAULT_NEEDLE_LENGTHS",
    "NEEDLE_MAX_NEW_TOKENS",
    "NeedleOptions",
    "NeedleSuite",
]

DEFAULT_NEEDLE_LENGTHS = (1024, 2048, 4096)
DEFAULT_NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_NEEDLE_DIGITS = 7
NEEDLE_MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class NeedleOptions:
    """Options of the needle suite: context lengths in tokens, depths in [0, 1] (0: start), digits 1 to 18."""

    needle_lengths: tuple[int, ...] = DEFAULT_NEEDLE_LENGTHS
    needle_depths: tuple[float, ...] = DEFAULT_NEEDLE_DEPTHS
    needle_digits: int = DEFAULT_NEEDLE_DIGITS

    def __post_init__(self) -> None:
        object.__setattr__(self, "needle_lengths", tuple(self.needle_lengths))
        object.__setattr__(self, "needle_depths", tuple(self.needle_depths))
        if not self.needle_lengths or not self.needle_depths:
            raise ValueError("needle lengths and depths must not be empty")
        for length in self.needle_lengths:
            positive_int("needle length", length)
        for depth in self.needle_depths:
            if isinstance(depth, bool) or not (isinstance(depth, (int, float)) and 0.0 <= depth <= 1.0):
                raise ValueError(f"needle depth must be in [0, 1], got {depth!r}")
        if len(set(self.needle_lengths)) != len(self.needle_lengths) or len(set(self.needle_depths)) != len(
            self.needle_depths
        ):
            raise ValueError("needle lengths and depths must not contain duplicates")
        if isinstance(self.needle_digits, bool) or not isinstance(self.needle_digits, int):
            raise ValueError(f"needle digits must be an integer, got {self.needle_digits!r}")
        if not 1 <= self.needle_digits <= 18:
            raise ValueError(f"needle digits must be in [1, 18], got {self.needle_digits}")


class NeedleSuite(Suite):
    """Needles over length x depth. ``limit``: needles (seeds ``seed .. seed + limit - 1``) per cell (default 1)."""

    name = "needle"
    description = "a number hidden in essay text, over context lengths x depths"
    options_type = NeedleOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        if tasks is not None:
            raise ValueError("the needle suite has no tasks: choose --needle-lengths and --needle-depths")

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        options: NeedleOptions = config.options
        samples = []
        for length in options.needle_lengths:
            for depth in options.needle_depths:
                for j in range(config.limit or 1):
                    seed = config.seed + j
                    digits = options.needle_digits
                    needle = build_needle_prompt(tokenizer, length, depth=depth, seed=seed, digits=digits)
                    parts = prompt_parts(tokenizer, needle.context, needle.question, config.chat_template)
                    ids, split = split_prompt(tokenizer, *parts)

                    def score(prediction: str, needle: NeedlePrompt = needle) -> float:
                        return 1.0 if needle.retrieved(prediction) else 0.0

                    samples.append(
                        EvalSample(
                            id=f"needle/{length}/{depth:g}/{j}",
                            task="needle",
                            input_ids=ids,
                            question_start=split,
                            max_new_tokens=cap_new_tokens(config, NEEDLE_MAX_NEW_TOKENS),
                            score=score,
                            gold=needle.answer,
                            meta={"length": length, "depth": float(depth), "seed": seed, "answer": needle.answer},
                        )
                    )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        options: NeedleOptions = config.options
        return {
            "needle_lengths": list(options.needle_lengths),
            "needle_depths": [float(d) for d in options.needle_depths],
            "needle_digits": options.needle_digits,
            "limit": config.limit or 1,
        }
