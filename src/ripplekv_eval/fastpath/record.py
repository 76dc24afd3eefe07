"""The shared prefill record: one full prefill of a prompt feeds every (method, budget) compressed cache.

kvpress compresses a layer's cache in a forward hook that runs *after* the layer's attention, so compression
never changes the prefill's hidden states, logits or the full keys and values each layer hands to its press.
:func:`record_prefill` runs the prompt once with a :class:`~ripplekv_eval.fastpath.recording_press.RecordingPress`,
which stores, per layer, exactly what ``compress`` receives and keeps the cache unchanged; presses are then derived
from the :class:`PrefillRecord` (:mod:`ripplekv_eval.fastpath.derive`) at the cost of their ``compress`` alone, and the
derived caches are passed over without copying them (:mod:`ripplekv_eval.fastpath.lean`).

Memory: a record holds one full (uncompressed) KV cache, the next token's logits and, per layer, the *last*
``hidden_tail`` input hidden states (by default :data:`~ripplekv_eval.fastpath.hidden_tail.DEFAULT_HIDDEN_TAIL`, the
65 SnapKV reads at the default window; all of them when ``hidden_tail`` is None), with the forward kwargs indexed by
query position cut to the same positions and the attention weights (when the attention implementation returns
them, as ``eager`` does: use ``sdpa``) likewise. What a run's presses read of the hidden states is
:func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_tail`, which the evaluation passes; ExpectedAttention, which
reads every position, is prescored instead (``prescore``). Residual-stream statistics a per-prompt rule reads are
computed as the prefill runs and kept per layer (:func:`residual_statistics_of`). A prompt longer than
``prefill_chunk`` is recorded in chunks (see :mod:`ripplekv_eval.fastpath.recording_press`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.inference.generate import prefill
from ripplekv.models.cache import cache_from_tensors
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, chunk_bounds, prefill_in_chunks
from ripplekv.presses.score_memo import ScoreMemo, scorer_key
from ripplekv_eval.fastpath.hidden_tail import DEFAULT_HIDDEN_TAIL
from ripplekv_eval.fastpath.recording_press import LayerRecord, RecordingPress

__all__ = ["PrefillRecord", "record_prefill", "residual_statistics_of"]


@dataclass
class PrefillRecord:
    """One full prefill of a prompt, enough to derive the cache any derivable press would have produced."""

    model: PreTrainedModel
    layers: tuple[LayerRecord, ...]
    next_logits: torch.Tensor  # (vocab,) logits of the token after the prompt (compression does not change them)
    prompt_tokens: int
    seconds: float  # wall time of the recorded prefill
    invalid: str | None = field(default=None, compare=False)  # set when a press wrote into the recorded tensors
    memo: ScoreMemo = field(default_factory=ScoreMemo, compare=False, repr=False)  # scores shared by derivations
    prescored: frozenset[Hashable] = field(default=frozenset(), compare=False)  # scorer keys scored while recording

    @property
    def hidden_tokens(self) -> int:
        """Trailing prompt positions whose hidden states the record holds (``prompt_tokens``: all of them)."""
        return int(self.layers[0].hidden_states.shape[1])

    def full_cache(self) -> DynamicCache:
        """The uncompressed cache (references to the recorded tensors)."""
        return cache_from_tensors([(layer.keys, layer.values) for layer in self.layers])

    def nbytes(self) -> int:
        """Bytes held by the record's tensors (each distinct storage counted once)."""
        seen: dict[int, int] = {}

        def add(value: Any) -> None:
            if isinstance(value, torch.Tensor):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
            elif isinstance(value, (tuple, list)):
                for item in value:
                    add(item)

        for layer in self.layers:
            add((layer.hidden_states, layer.keys, layer.values, layer.attentions, *layer.kwargs.values()))
        add(self.memo.pinned_tensors())  # the prescored scores
        return sum(seen.values())


def record_prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    hidden_tail: int | None = DEFAULT_HIDDEN_TAIL,
    residual_statistics: Mapping[str, Callable[[torch.Tensor, torch.Tensor], Any]] | None = None,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
    prescore: Sequence[ScorerPress] = (),
) -> PrefillRecord:
    """Prefill ``input_ids`` (shape ``(1, n)``) once, recording every layer's compression inputs.

    A prompt longer than ``prefill_chunk`` is prefilled in chunks of at most ``prefill_chunk`` tokens over the
    growing cache (:mod:`ripplekv.models.chunked_prefill`), so the prefill's activations are those of one chunk; the
    record holds what a one-pass prefill's holds (the full cache, the last ``hidden_tail`` hidden states, the
    kwargs and attention weights cut to them, the residual statistics), joined from the chunks and equal to it up
    to float rounding: presses derived from it see the same inputs, however the prompt was cut. A prompt within
    ``prefill_chunk`` is prefilled in one pass, exactly as without chunking.

    Args:
        model: the model.
        input_ids: the prompt (or its context part), one unpadded sequence.
        hidden_tail: hidden states kept per layer, the last ``hidden_tail`` positions; None keeps all of them
            (``n_tokens * n_layers * hidden_size`` elements, 1.5 times the cache itself on SmolLM2-135M). The
            default, :data:`~ripplekv_eval.fastpath.hidden_tail.DEFAULT_HIDDEN_TAIL` (65), is what SnapKV and the
            presses on its scorer read at the default window. Pass
            :func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_tail` of every press to be derived: the record then
            holds what they read and no more (:mod:`ripplekv_eval.fastpath.hidden_tail`); deriving a press that reads
            more than the record holds (ExpectedAttention not prescored, a wider window) raises
            :class:`~ripplekv_eval.fastpath.derive.NotDerivableError`, naming this argument.
        residual_statistics: per-layer statistics of the residual stream, computed while the prefill runs and kept in
            each :class:`~ripplekv_eval.fastpath.recording_press.LayerRecord`'s ``statistics`` under their name:
            ``fn(residual_in, attention_output)`` of the decoder layer's input and its attention output, both ``(batch,
            tokens, hidden)`` (what a per-prompt press such as SqueezeAttention reads and a record of the attention's
            inputs cannot give). Each layer's tensors are released as soon as its statistics are computed. A chunked
            prefill needs each to be a :class:`~ripplekv.allocation.per_prompt.TokenStatistic` (per-token values of
            every chunk, reduced once over the whole prompt; :func:`residual_statistics_of` gives them), else raises
            ValueError.
        prefill_chunk: most tokens per prefill pass (an integer >= 1; default
            :data:`~ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK`); None: one pass whatever the length.
        prescore: scorers of :data:`~ripplekv_eval.fastpath.hidden_tail.PRESCORABLE` (ExpectedAttention) to score
            while the prefill runs, so the record need not keep the whole prompt's hidden states for them
            (:func:`~ripplekv_eval.fastpath.hidden_tail.prescored_scorers` of the presses to derive; pass the same to
            :func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_tail`). In one pass each layer is scored by the
            scorer's own ``score`` on its whole input, exactly as deriving from every hidden state; in chunks from the
            prompt's query moments (:mod:`ripplekv_eval.fastpath.query_moments`), equal to it up to the rounding of
            the model's dtype. The scores are pinned in the record's memo, and its ``seconds`` include them.
    """
    chunk = check_prefill_chunk(prefill_chunk)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"expected one non-empty unpadded sequence of shape (1, n), got {tuple(input_ids.shape)}")
    tokens = int(input_ids.shape[1])
    chunked = len(chunk_bounds(tokens, chunk)) > 1
    if chunked and residual_statistics:
        plain = sorted(name for name, fn in residual_statistics.items() if not isinstance(fn, TokenStatistic))
        if plain:
            raise ValueError(
                f"residual statistic(s) {', '.join(plain)} cannot be computed over a prefill in chunks of {chunk} "
                f"tokens ({tokens} in the prompt): give them as TokenStatistic (per-token values and their "
                "reduction), or pass prefill_chunk=None"
            )
    press = RecordingPress(hidden_tail=hidden_tail, prescore=tuple(prescore))
    statistics: dict[int, dict[str, Any]] = {}
    token_values: dict[int, dict[str, list[torch.Tensor]]] = {}
    handles = []
    if residual_statistics:
        residual: dict[int, torch.Tensor] = {}
        decoder = model.model.language_model if hasattr(model.model, "language_model") else model.model
        for index, layer in enumerate(decoder.layers):

            def keep(module: nn.Module, args: tuple, kwargs: dict, index: int = index) -> None:
                residual[index] = args[0] if args else kwargs["hidden_states"]

            def compute(module: nn.Module, args: tuple, output: Any, index: int = index) -> None:
                attention = output[0] if isinstance(output, tuple) else output
                inputs = residual.pop(index)
                if not chunked:
                    statistics[index] = {name: fn(inputs, attention) for name, fn in residual_statistics.items()}
                    return
                held = token_values.setdefault(index, {})
                for name, fn in residual_statistics.items():
                    held.setdefault(name, []).append(fn.per_token(inputs, attention))  # type: ignore[attr-defined]

            handles.append(layer.register_forward_pre_hook(keep, with_kwargs=True))
            handles.append(layer.self_attn.register_forward_hook(compute))
    try:
        if chunked:
            device = next(model.parameters()).device
            start = time.perf_counter()
            with press(model):
                cache, logits = prefill_in_chunks(
                    model, input_ids.to(device), chunk, before_chunk=lambda a, b: press.begin_chunk(a, b, tokens)
                )
            press.assemble(cache, tokens)
            next_logits, seconds = logits[0, -1], time.perf_counter() - start
        else:
            state = prefill(model, input_ids, press)
            next_logits, seconds = state.next_logits, state.seconds
    finally:
        for handle in handles:
            handle.remove()
    for index, held in token_values.items():
        statistics[index] = {name: residual_statistics[name].reduce(parts) for name, parts in held.items()}  # type: ignore[index,union-attr]
    n_layers = model.config.get_text_config().num_hidden_layers
    missing = [i for i in range(n_layers) if i not in press.layers]
    if missing:
        raise ValueError(f"the prefill recorded no attention output for layer(s) {missing}: unsupported model")
    layers = tuple(
        replace(press.layers[i], statistics=statistics[i]) if i in statistics else press.layers[i]
        for i in range(n_layers)
    )
    press.release()
    prescored = frozenset(scorer_key(scorer) for scorer in press.prescore)
    return PrefillRecord(model, layers, next_logits, tokens, seconds, memo=press.memo, prescored=prescored)


def residual_statistics_of(presses: Iterable[BasePress]) -> dict[str, Callable[[torch.Tensor, torch.Tensor], Any]]:
    """The residual-stream statistics a record needs to derive every one of ``presses`` (see :func:`record_prefill`).

    Each is the press's :attr:`~ripplekv.presses.per_prompt_press.PerPromptBudgetPress.residual_statistic`: a
    :class:`~ripplekv.allocation.per_prompt.TokenStatistic` where the rule's statistic reduces per-token values (so
    a chunked prefill can compute it), else the plain function.

    Args:
        presses: the presses that will be derived from the record.
    """
    found: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {}
    for press in presses:
        if getattr(press, "derives_all_layers", False) and press.needs_residual:
            found[press.schedule.rule.name] = press.residual_statistic
    return found
