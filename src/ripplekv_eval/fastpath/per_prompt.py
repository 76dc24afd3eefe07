"""A per-prompt press's cache from a prefill record: every layer's statistic and scores, then every layer's budget.

:class:`~ripplekv.presses.per_prompt_press.PerPromptBudgetPress` (and :class:`~ripplekv.presses.lava_press.LavaPress`)
decide their budgets after the last compressed layer, so their cache is derived all layers at once: the statistics
(through the record's memo, or recorded while the prefill ran for a rule that reads the residual stream), the
scorer's scores (through the memo), the press's own ``budgets`` and ``prune``. The same tensors as the press's own
prefill (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import PretrainedConfig

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.models.headwise import MASKED_KEYS
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.selection_window import check_compressible
from ripplekv_eval.fastpath.hidden_tail import PER_PROMPT
from ripplekv_eval.fastpath.recording_press import LayerRecord
from ripplekv_eval.fastpath.score_memo import ScoreMemo

__all__ = ["derive_per_prompt", "recorded_statistics", "residual_statistics_of"]


def recorded_statistics(
    press: PerPromptBudgetPress, layers: Sequence[LayerRecord], config: PretrainedConfig, memo: ScoreMemo
) -> list[Any]:
    """The rule's statistic of every compressed layer of a prefill record, what :func:`derive_per_prompt` allocates
    from: computed once per record, rule and window (``memo``), or recorded while the prefill ran (the residual
    stream's rules, :func:`residual_statistics_of`).

    Raises:
        ValueError: for a layer the press cannot compress, or a residual-stream statistic the record lacks.
    """
    rule = press.schedule.rule  # type: ignore[union-attr]
    stats = []
    for index in compressed_layers(config):
        layer = layers[index]
        check_compressible(press, layer.kwargs, layer.keys.shape[2], press.window)
        if press.needs_residual:
            if rule.name not in layer.statistics:
                raise ValueError(f"the prefill record holds no {rule.name} statistic: record it (see record_prefill)")
            stats.append(layer.statistics[rule.name])
            continue

        def compute(layer: LayerRecord = layer) -> Any:
            return press.layer_statistic(layer.module, layer.hidden_states, layer.keys, layer.values, layer.kwargs)

        stats.append(memo.get("statistic", (repr(rule), press.window, press.reserve), index, layer.keys, compute))
    return stats


def derive_per_prompt(
    press: PerPromptBudgetPress, layers: Sequence[LayerRecord], config: PretrainedConfig, memo: ScoreMemo
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's pruned keys and values from a prefill record's layers; head-wise masks (LAVa) are left on the
    attention modules as kvpress's ``masked_key_indices``, for the caller to move into the derived cache."""
    compressed = compressed_layers(config)
    stats = recorded_statistics(press, layers, config, memo)
    scores = {}
    for index in compressed:
        layer = layers[index]
        scores[index] = memo.scores(
            press.press,
            layer.module,
            layer.hidden_states,
            layer.keys,
            layer.values,
            layer.attentions,
            dict(layer.kwargs),
        )
    budgets = press.budgets(stats, config, layers[compressed[0]].keys.shape[2])
    out = []
    for index, layer in enumerate(layers):
        if index not in budgets:
            out.append((layer.keys, layer.values))
            continue
        kept_keys, kept_values, masked = press.prune(layer.keys, layer.values, scores[index], budgets[index], config)
        if masked is not None:
            setattr(layer.module, MASKED_KEYS, masked)
        out.append((kept_keys, kept_values))
    return out


def residual_statistics_of(presses: Iterable[BasePress]) -> dict[str, Callable[[torch.Tensor, torch.Tensor], Any]]:
    """The residual-stream statistics a record computes while it runs to derive every one of ``presses``.

    Per rule name, the rule's ``layer_statistic(residual_in, attention_output)``; a
    :class:`~ripplekv.allocation.per_prompt.TokenStatistic` where the rule reduces per-token values (it has
    ``token_statistic`` and ``statistic_from_tokens``, as SqueezeAttention's mean over tokens), which a prefill in
    chunks accumulates over the whole prompt.
    """
    found: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {}
    for press in presses:
        if type(press) not in PER_PROMPT or not press.needs_residual:  # type: ignore[attr-defined]
            continue
        rule = press.schedule.rule  # type: ignore[attr-defined]
        per_token = getattr(rule, "token_statistic", None)
        reduce = getattr(rule, "statistic_from_tokens", None)
        whole = rule.layer_statistic
        found[rule.name] = whole if per_token is None or reduce is None else TokenStatistic(whole, per_token, reduce)
    return found
