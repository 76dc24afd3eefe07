"""Inference over compressed caches: prefill with a press, greedy decoding, teacher-forced fidelity."""

from ripplekv.inference.fidelity import Fidelity, fidelity, mean_nll, teacher_forced_logprobs
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
    "Fidelity",
    "GenerationResult",
    "ModuleState",
    "Prefill",
    "extend",
    "fidelity",
    "generate_answer",
    "greedy_decode",
    "kept_tokens",
    "mean_nll",
    "prefill",
    "teacher_forced_logprobs",
]
