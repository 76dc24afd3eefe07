"""The interface every evaluation suite implements, and helpers the suites share.

A suite turns a :class:`SuiteRequest` into scored samples; it owns its options (a frozen dataclass validated in
``__post_init__``), task names, samples and its part of ``config.json``. The runner only calls these methods, so a
new suite is a :class:`Suite` subclass registered in :mod:`ripplekv_eval.suites`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ripplekv.inference.generate import chat_prompt_parts

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ripplekv_eval.sample import EvalSample

__all__ = [
    "Suite",
    "SuiteRequest",
    "cap_new_tokens",
    "default_max_length",
    "encode",
    "flag",
    "prompt_parts",
    "split_prompt",
    "use_chat_template",
]


class SuiteRequest(Protocol):
    """What a run asks of a suite (``running.config.EvalConfig`` is one)."""

    options: Any
    tasks: Sequence[str] | None
    limit: int | None
    chat_template: str
    max_new_tokens: int | None
    seed: int


def flag(option: str) -> str:
    """The ``ripplekv eval`` flag of an option name (``needle_lengths`` -> ``--needle-lengths``)."""
    return "--" + option.replace("_", "-")


class Suite(ABC):
    """One kind of evaluation: its options, tasks, samples and identity in ``config.json``.

    Subclasses set ``name``, ``description`` and ``options_type``: a frozen dataclass whose fields are the suite's
    options, named as the ``ripplekv eval`` flags with ``_`` for ``-``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    options_type: ClassVar[type]

    def parse_options(self, options: Any) -> Any:
        """The options dataclass from a mapping of option name -> value (or the dataclass itself).

        Raises:
            ValueError: names the flags of options the suite does not have.
        """
        if isinstance(options, self.options_type):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a mapping of option name to value, got {type(options).__name__}")
        known = [f.name for f in dataclasses.fields(self.options_type)]
        unknown = [name for name in options if name not in known]
        if unknown:
            own = ", ".join(flag(name) for name in known) or "none"
            raise ValueError(
                f"{', '.join(flag(str(name)) for name in unknown)} does not apply to the {self.name} suite "
                f"(its own options: {own})"
            )
        return self.options_type(**options)

    @abstractmethod
    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        """Raise ValueError for task names the suite does not have (None: the suite's default)."""

    @abstractmethod
    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        """The samples of ``config``, in run order (``config.options`` is this suite's options dataclass).

        ``model`` (may be None) is needed where an option's default depends on it (LongBench's ``max_length``).
        """

    @abstractmethod
    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        """The suite's part of ``config.json``'s resolved configuration, defaults filled in (compared on resume)."""

    def sources(self, config: SuiteRequest) -> dict[str, Any]:
        """Where the suite's data came from (recorded in ``config.json``, not compared on resume)."""
        return {}


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def split_prompt(tokenizer: PreTrainedTokenizerBase, head: str, tail: str) -> tuple[tuple[int, ...], int]:
    """Token ids of ``head + tail``, each tokenized on its own (as ``generate_answer`` does), and the split."""
    head_ids, tail_ids = encode(tokenizer, head), encode(tokenizer, tail)
    return tuple(head_ids + tail_ids), len(head_ids)


def cap_new_tokens(config: SuiteRequest, tokens: int) -> int:
    """A task's own answer length ``tokens``, capped by ``config.max_new_tokens``."""
    return min(tokens, config.max_new_tokens) if config.max_new_tokens else tokens


def use_chat_template(tokenizer: PreTrainedTokenizerBase, mode: str) -> bool:
    """Whether prompts go through the chat template: ``mode`` ``auto`` (when the tokenizer has one), ``on``, ``off``."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has_template:
        raise ValueError("--chat-template on, but the tokenizer has no chat template")
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"chat template mode must be auto, on or off, got {mode!r}")
    return has_template and mode != "off"


def prompt_parts(tokenizer: PreTrainedTokenizerBase, context: str, question: str, mode: str) -> tuple[str, str]:
    """The prompt of ``context`` + ``question`` split where the question starts.

    With the chat template (:func:`use_chat_template`) it is :func:`ripplekv.inference.generate.chat_prompt_parts`;
    without, that function's plain layout: ``context`` then ``"\\n\\n" + question + "\\nAnswer:"``.
    """
    if use_chat_template(tokenizer, mode):
        return chat_prompt_parts(tokenizer, context, question)
    return context, "\n\n" + question + "\nAnswer:"


def default_max_length(model: PreTrainedModel) -> int:
    """The model's ``max_position_embeddings`` (LongBench's default truncation length)."""
    value = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(value, int) or value < 2:
        raise ValueError("the model config has no max_position_embeddings: pass --max-length")
    return value
