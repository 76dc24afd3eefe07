"""Inference over compressed caches: prefill with a press, greedy decoding (:mod:`~ripplekv.inference.generate`),
teacher forcing (:mod:`~ripplekv.inference.teacher_forcing`), a profile's r and gamma
(:mod:`~ripplekv.inference.setting`).

The names below resolve on first use (PEP 562): importing this package imports none of its modules.
"""

from __future__ import annotations

from ripplekv.lazy import lazy_exports

# public name -> the module that defines it
_EXPORTS = {
    name: "ripplekv.inference.generate"
    for name in (
        "PROTOCOLS",
        "GenerationResult",
        "Prefill",
        "cache_forward",
        "extend",
        "generate_answer",
        "greedy_decode",
        "kept_tokens",
        "prefill",
    )
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
