"""Inference over compressed caches: prefill with a press, greedy decoding."""

from ripplekv.inference.generate import (
    PROTOCOLS,
    GenerationResult,
    Prefill,
    cache_forward,
    extend,
    generate_answer,
    greedy_decode,
    kept_tokens,
    prefill,
)

__all__ = [
    "PROTOCOLS",
    "GenerationResult",
    "Prefill",
    "cache_forward",
    "extend",
    "generate_answer",
    "greedy_decode",
    "kept_tokens",
    "prefill",
]
