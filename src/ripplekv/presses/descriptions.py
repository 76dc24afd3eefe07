"""What each method and each token scorer computes, one line per name: the legends of reports and ``docs/cli.md``.

Kept apart from :mod:`~ripplekv.presses.registry` and :mod:`~ripplekv.presses.scorers` (which import kvpress and
torch) so that ``ripplekv report`` prints them without importing either; ``tests/test_presses.py`` and
``tests/test_eval_scorers.py`` check that the names here are the registered ones.
"""

from __future__ import annotations

from ripplekv.profiling.damage_profile import ORACLE_METHOD

__all__ = ["METHOD_DESCRIPTIONS", "SCORER_DESCRIPTIONS", "describe_method"]

METHOD_DESCRIPTIONS: dict[str, str] = {
    "full": "full cache (no compression)",
    "streamingllm": "StreamingLLM (kvpress): attention sinks + recent tokens, uniform budgets",
    "snapkv": "SnapKV scorer, uniform per-layer budgets",
    "pyramidkv": "SnapKV scorer, PyramidKV schedule (authors' code: linear in depth, beta 20), SnapKV's total",
    "pyramidkv-kvpress": "kvpress 0.5.5 PyramidKVPress (falls back to uniform when prompt x budget / 20 < window)",
    "adakv": "AdaKV (kvpress): SnapKV scores, head-wise budgets within each layer (keys masked, not freed)",
    "ripplekv": "SnapKV scorer, RippleKV budgets from the profile's downstream-KL scores",
    "ripplekv-local": "SnapKV scorer, RippleKV budgets from the profile's local signal (ablation)",
    "ripplekv-ada": "SnapKV scores, RippleKV per-layer budgets, AdaKV head-wise allocation in each layer (keys masked)",
    ORACLE_METHOD: "SnapKV scorer, RippleKV budgets from a damage profile (measured single-layer damage; ceiling)",
    "cake": "SnapKV scorer, CAKE budgets per prompt (window attention's entropy x variance per layer), SnapKV's total",
    "squeezeattention": "SnapKV scorer, SqueezeAttention budgets per prompt (cosine of each layer's residual update)",
    "dynamickv": "SnapKV scorer, DynamicKV budgets per prompt (global top-k of window attention over layers)",
    "lava": "SnapKV scorer, LAVa: layer budgets per prompt (value-weighted entropy), head-wise split (keys masked)",
    "lava-layer": "SnapKV scorer, LAVa's layer rule alone (value-weighted entropy per layer), no head-wise split",
}
"""One line per method name: what it computes (used by reports so every table says which is which)."""

SCORER_DESCRIPTIONS: dict[str, str] = {
    "snapkv": "SnapKV: attention of the last window_size queries, pooled (the window itself always kept)",
    "expected_attention": "ExpectedAttention: attention expected from future queries' statistics, value norms",
    "tova": "TOVA: the last query's attention, averaged over heads",
    "knorm": "Knorm: keys of smallest L2 norm kept",
    "keydiff": "KeyDiff: keys least similar to the mean key kept",
    "streaming_llm": "StreamingLLM's rule as a scorer: the first 4 tokens and the most recent",
    "random": "random scores (seed 0, a floor for any scorer)",
    "lagkv": "LagKV: each chunk's keys and values against the next chunk's statistics",
    "leverage": "leverage scores of a random sketch of the keys",
    "cur": "CUR: leverage of the key-value product, local approximation",
    "compactor": "Compactor: leverage scores blended with non-causal chunked attention",
    "non_causal_attention": "attention within chunks of the prompt, non-causal",
    "critical_snapkv": "CriticalKV over SnapKV: SnapKV scores re-weighted by each value's projected norm",
    "observed_attention": "attention received during the prefill (needs eager attention)",
    "lava": "LAVa: window attention, max-pooled, x the KV head's largest value L1 norm, max over its query heads",
}
"""One line per scorer name: what it ranks tokens by (reports and ``docs/cli.md``)."""


def describe_method(name: str) -> str:
    """What a method spec computes: its method's description, and the parameters it was given (a spec of
    :mod:`ripplekv.presses.method_spec`, ``cake:tau1=2``: "..., with tau1=2"); a name without a description prints
    as it is.

    Args:
        name: a method name or spec.
    """
    base, _, params = name.partition(":")
    text = METHOD_DESCRIPTIONS.get(base.strip().lower())
    if text is None:
        return name
    return f"{text}, with {params.replace(',', ', ')}" if params else text
