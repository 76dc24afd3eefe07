"""What each token scorer and each method spec computes, one line: the legends of reports and ``docs/cli.md``.

Apart from :mod:`~ripplekv.presses.scorers` so that ``ripplekv report`` prints them without kvpress or torch.
"""

from __future__ import annotations

from ripplekv.presses.method_spec import METHOD_TABLE, PARAM_SEPARATOR, base_method

__all__ = ["SCORER_DESCRIPTIONS", "describe_method"]

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
    """What a method spec computes: its description, with the given parameters (``cake:tau1=2``: "..., with tau1=2");
    an unknown name prints as it is."""
    method = METHOD_TABLE.get(base_method(name))
    if method is None:
        return name
    params = name.partition(PARAM_SEPARATOR)[2]
    return f"{method.description}, with {params.replace(',', ', ')}" if params else method.description


def __getattr__(name: str) -> object:
    """Name the replacement of a removed name (an ``ImportError``, which ``from ... import`` passes on)."""
    if name == "METHOD_DESCRIPTIONS":
        raise ImportError(
            "ripplekv.presses.descriptions.METHOD_DESCRIPTIONS is gone: use "
            "ripplekv.presses.method_spec.METHOD_TABLE[name].description"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
