"""The RULER-style suite: synthetic tasks generated locally from a seed (:mod:`ripplekv_eval.tasks.ruler`).

Without the chat template the prompt is RULER's: context, newline, question, answer prefix. The gold answer is the
expected outputs joined by ``", "`` (RULER's ``string_match_all`` scores it 1.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ripplekv.inference.generate import chat_prompt_parts
from ripplekv_eval.sample import EvalSample, positive_int
from ripplekv_eval.suites.base import Suite, SuiteRequest, cap_new_tokens, split_prompt, use_chat_template
from ripplekv_eval.tasks import ruler

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


__all__ = ["DEFAULT_CONTEXT_TOKENS", "DEFAULT_RULER_SAMPLES", "RulerOptions", "RulerSuite"]

DEFAULT_CONTEXT_TOKENS = 4096
DEFAULT_RULER_SAMPLES = 10


@dataclass(frozen=True)
class RulerOptions:
    """Options of the RULER suite: ``context_tokens``, each sample's context length in the model's tokens."""

    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    def __post_init__(self) -> None:
        positive_int("context_tokens", self.context_tokens)


def _parts(tokenizer: PreTrainedTokenizerBase, sample: ruler.SyntheticSample, mode: str) -> tuple[str, str]:
    if use_chat_template(tokenizer, mode):
        return chat_prompt_parts(tokenizer, sample.context, sample.question)
    return sample.context, "\n" + sample.question + sample.answer_prefix


class RulerSuite(Suite):
    """RULER-style tasks. ``limit``: generated samples per task (default 10); ``seed`` draws them."""

    name = "ruler"
    description = "RULER-style synthetic tasks generated locally (needles, variable tracking, common/frequent words)"
    options_type = RulerOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        unknown = [t for t in tasks or () if t not in ruler.TASKS]
        if unknown:
            raise ValueError(f"unknown RULER task(s) {', '.join(unknown)}; tasks are: {', '.join(ruler.TASKS)}")

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        per_task = config.limit or DEFAULT_RULER_SAMPLES
        context_tokens = config.options.context_tokens
        generated = ruler.generate_suite(tokenizer, context_tokens, per_task, seed=config.seed, tasks=config.tasks)
        samples = []
        counts: dict[str, int] = {}
        for synthetic in generated:
            index = counts.get(synthetic.task, 0)
            counts[synthetic.task] = index + 1
            ids, split = split_prompt(tokenizer, *_parts(tokenizer, synthetic, config.chat_template))

            def score(prediction: str, synthetic: ruler.SyntheticSample = synthetic) -> float:
                return ruler.score(synthetic, prediction)

            samples.append(
                EvalSample(
                    id=f"{synthetic.task}/{index}",
                    task=synthetic.task,
                    input_ids=ids,
                    question_start=split,
                    max_new_tokens=cap_new_tokens(config, synthetic.max_new_tokens),
                    score=score,
                    gold=", ".join(synthetic.answers),
                    meta={"seed": synthetic.seed, "context_tokens": synthetic.context_tokens},
                )
            )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        return {
            "tasks": list(config.tasks or ruler.TASKS),
            "limit": config.limit or DEFAULT_RULER_SAMPLES,
            "context_tokens": config.options.context_tokens,
        }
