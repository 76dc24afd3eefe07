"""Inference over compressed caches: prefill with a press, greedy decoding."""

from ripplekv.inference.generate import (
    PROTOCOLS,
    GenerationResult,
    Prefill,
    extend,
    generate_answer,
    greedy_decode,
    kept_tokens,
    prefill,
)
from ripplekv.inference.module_state import ModuleState

__all__ = [
    "PROTOCOLS",
    "GenerationResult",
    "ModuleState",
    "Prefill",
    "extend",
    "generate_answer",
    "greedy_decode",
    "kept_tokens",
    "prefill",
]
