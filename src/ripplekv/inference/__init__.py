"""Inference over compressed caches: prefill with a press, then greedy decoding."""

from ripplekv.inference.generate import (
    PROTOCOLS,
    GenerationResult,
    Prefill,
    extend,
    generate_answer,
    greedy_decode,
    prefill,
)

__all__ = ["PROTOCOLS", "GenerationResult", "Prefill", "extend", "generate_answer", "greedy_decode", "prefill"]
