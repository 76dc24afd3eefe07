"""The LongBench suite: official ``<task>.jsonl`` files run as THUDM/LongBench's ``pred.py`` runs them.

The protocol (prompts, truncation, chat rule, lengths, stops, metrics) is :mod:`ripplekv_eval.tasks.longbench`'s;
``gold_nll``'s gold answer is the record's first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv_eval.sample import EvalSample, positive_int
from ripplekv_eval.suites.base import Suite, SuiteRequest, cap_new_tokens, default_max_length
from ripplekv_eval.tasks import longbench

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


__all__ = ["LongBenchOptions", "LongBenchSuite"]


@dataclass(frozen=True)
class LongBenchOptions:
    """Options of the LongBench suite.

    Args:
        data_dir: folder of official ``<task>.jsonl`` files (``_e`` files for LongBench-E); required.
        max_length: middle truncation length in tokens (default: the model's ``max_position_embeddings``).
        skip: records skipped at the start of each task file before ``limit`` counts: a held-out split of files
            another run used the first records of (``--limit 15`` there, ``--skip 15`` here).
    """

    data_dir: str | None = None
    max_length: int | None = None
    skip: int | None = None

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise ValueError("the longbench suite needs --data-dir (a folder of official <task>.jsonl files)")
        object.__setattr__(self, "data_dir", str(self.data_dir))
        positive_int("max_length", self.max_length, allow_none=True)
        if self.skip is not None and (isinstance(self.skip, bool) or not isinstance(self.skip, int) or self.skip < 0):
            raise ValueError(f"skip must be an integer >= 0, got {self.skip!r}")


class LongBenchSuite(Suite):
    """LongBench v1 / LongBench-E, English tasks. ``limit``: the first N records of each task file after ``skip``."""

    name = "longbench"
    description = "LongBench v1 / LongBench-E files (official prompts, truncation, chat rule and metrics)"
    options_type = LongBenchOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        for task in tasks or ():
            longbench.base_task(task)

    def tasks(self, config: SuiteRequest) -> list[str]:
        """``config.tasks``, or every English task with a file in the data folder."""
        if config.tasks is not None:
            return list(config.tasks)
        data_dir = Path(config.options.data_dir)
        if not data_dir.is_dir():
            raise FileNotFoundError(f"LongBench data folder not found: {data_dir}")
        tasks = [task for task in longbench.ENGLISH_TASKS if (data_dir / f"{task}.jsonl").is_file()]
        if not tasks:
            raise ValueError(f"no LongBench task file (<task>.jsonl, English tasks) in {data_dir}")
        return tasks

    def max_length(self, config: SuiteRequest, model: PreTrainedModel | None) -> int:
        """The truncation length: the option, else the model's ``max_position_embeddings``."""
        if config.options.max_length is not None:
            return config.options.max_length
        if model is None:
            raise ValueError("LongBench needs max_length or a model to take it from")
        return default_max_length(model)

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        max_length = self.max_length(config, model)
        newline = None
        samples: list[EvalSample] = []
        for task in self.tasks(config):
            skip = config.options.skip or 0
            records = longbench.load_task(config.options.data_dir, task)[skip:]
            records = records[: config.limit]
            seen: dict[str, int] = {}
            for record in records:
                built = longbench.build_prompt(record, tokenizer, max_length, config.chat_template)
                stops: frozenset[int] = frozenset()
                if longbench.stop_on_newline(task):
                    newline = longbench.newline_token_id(tokenizer) if newline is None else newline
                    stops = frozenset({newline})
                count = seen.get(record.id, 0)
                seen[record.id] = count + 1

                def score(prediction: str, record: longbench.LongBenchRecord = record) -> float:
                    return longbench.score_record(record.task, prediction, record.answers, record.all_classes)

                samples.append(
                    EvalSample(
                        id=f"{task}/{record.id}" + (f"#{count}" if count else ""),
                        task=task,
                        input_ids=tuple(built.input_ids),
                        question_start=built.question_start,
                        max_new_tokens=cap_new_tokens(config, longbench.MAX_NEW_TOKENS[record.base_task]),
                        score=score,
                        gold=record.answers[0],
                        extra_stop_ids=stops,
                        meta={"length": record.length, "truncated": built.truncated},
                    )
                )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        resolved = {"tasks": self.tasks(config), "limit": config.limit, "max_length": self.max_length(config, model)}
        if config.options.skip:  # only when set: runs from before the option resume unchanged
            resolved["skip"] = config.options.skip
        return resolved

    def sources(self, config: SuiteRequest) -> dict[str, Any]:
        return {"data_dir": config.options.data_dir}
