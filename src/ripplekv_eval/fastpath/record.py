"""The shared prefill record: one full prefill of a prompt feeds every (method, budget) compressed cache.

kvpress compresses in a hook after each layer's attention, so compression never changes the prefill's hidden states,
logits or the keys and values handed to the press: :func:`record_prefill` stores per layer what ``compress``
receives, and :mod:`ripplekv_eval.fastpath.derive` runs presses on it at the cost of their ``compress`` alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from kvpress.presses.scorer_press import ScorerPress
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.inference.generate import prefill
from ripplekv.models.cache import cache_from_tensors
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, chunk_bounds, prefill_in_chunks
from ripplekv.models.decoder import decoder_layers
from ripplekv_eval.fastpath.hidden_tail import DEFAULT_HIDDEN_TAIL
from ripplekv_eval.fastpath.recording_press import LayerRecord, RecordingPress
from ripplekv_eval.fastpath.score_memo import ScoreMemo, scorer_key


@dataclass
class PrefillRecord:
    """One full prefill of a prompt, enough to derive the cache any derivable press would have produced."""

    model: PreTrainedModel
    input_ids: torch.Tensor  # (1, prompt_tokens): the prompt (a press the fast path does not derive prefills it)
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

    A prompt longer than ``prefill_chunk`` (None: one pass) is prefilled in chunks, equal to one pass up to float
    rounding. ``hidden_tail``: hidden states kept per layer (None: all;
    :func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_tail` of the presses to derive).
    ``residual_statistics``: ``fn(residual_in, attention_output)`` per name, kept in each layer's ``statistics``
    (a chunked prefill needs :class:`~ripplekv.allocation.per_prompt.TokenStatistic`). ``prescore``: scorers scored
    while the prefill runs (:func:`~ripplekv_eval.fastpath.hidden_tail.prescored_scorers`), pinned in the memo.
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
        for index, layer in enumerate(decoder_layers(model)):

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
    return PrefillRecord(model, input_ids, layers, next_logits, tokens, seconds, memo=press.memo, prescored=prescored)
