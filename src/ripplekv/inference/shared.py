"""Shared prefill: one full prefill of a prompt feeds every (method, budget) compressed cache.

kvpress compresses a layer's cache in a forward hook that runs *after* the layer's attention, so compression
never changes the prefill's hidden states, logits or the full keys and values each layer hands to its press.
:func:`record_prefill` runs the prompt once with a :class:`RecordingPress`, which stores, per layer, exactly
what ``compress`` receives (the attention module, its input hidden states, the full keys and values, the
attention weights if the attention implementation returned any, and the forward kwargs) and keeps the cache
unchanged. :func:`derived_prefill` (or :func:`derive_cache`) then applies any derivable press to that record layer
by layer and builds the compressed cache from the results: the same tensors a direct ``prefill(model, ids, press)``
produces (tested tensor for tensor), at the cost of the press's ``compress`` alone.

Which presses are derivable (:func:`is_derivable`, checked again on every call):

1. the press keeps :class:`BasePress`'s ``forward_hook`` and ``__call__``: its whole effect on a prefill is
   to replace each layer's keys and values by what ``compress`` returns, plus any attributes ``compress`` sets on
   the attention module (presses that override the hook or the context manager, e.g. decoding-time or composed
   presses, are not derivable); a press class may also declare ``derivable_from_record = False`` to opt out;
2. ``compress`` leaves the recorded tensors as they were (a press writing into them in place invalidates the
   record and raises :class:`NotDerivableError`);
3. ``compress`` only reads kwargs the record holds (everything the attention layer received except the live
   cache ``past_key_values`` and ``hidden_states``, which is recorded as its own field); reading another one
   raises :class:`NotDerivableError`.

Presses that act through attention-module state are derivable too. AdaKV keeps every key and sets
``module.masked_key_indices``, which kvpress's attention wrapper reads on every later pass. Around each layer's
``compress`` the module's instance attributes are snapshotted; what ``compress`` changed is captured as a
:class:`~ripplekv.inference.module_state.ModuleState` of that layer and the module is restored at once. The
captured state travels with the derived cache as ``Prefill.attention_state``, and ``extend``, ``greedy_decode``
and ``teacher_forced_logprobs`` set it on the modules for the duration of each pass over that cache and put back
what was there afterwards (also on an exception). Configurations derived from one record therefore never see
each other's masks, and the modules are left as they were. :func:`compress_recorded` returns a bare cache and so
refuses such presses; use :func:`derived_prefill`.

FullPress, StreamingLLM, SnapKV, PyramidKV (kvpress's and the authors' schedule), AdaKV and RippleKV (any scorer)
are derivable.

Memory: a record holds one full (uncompressed) KV cache, the next token's logits and, per layer, the *last*
``hidden_tail`` input hidden states (all of them when ``hidden_tail`` is None), with the forward kwargs indexed
by query position (``position_embeddings``, ``position_ids``, ``cache_position``, a 4D ``attention_mask``) and the
attention weights (when the attention implementation returns them, as ``eager`` does: use ``sdpa``) cut to the
same positions, so a scorer sees consistent queries. The tail is copied out of each layer's hidden states as the
prefill runs, so the whole prompt's hidden states of every layer (``n_tokens * n_layers * hidden_size``
elements, more than the cache itself on small models) are never held at once. What a press reads of them is
declared (:func:`hidden_states_needed`): SnapKV and the presses built on its scorer (PyramidKV, AdaKV,
RippleKV) read the last ``window_size`` positions and check the query length exceeds the window, so they need
``window_size + 1``; TOVA the last position; KNorm, KeyDiff, StreamingLLM, QFilter, Random and the full cache
none; ExpectedAttention (query statistics over the prompt) and any press not declared all of them.
:func:`hidden_states_tail` takes the most that a run's presses need, for the caller to pass to
:func:`record_prefill`; deriving a press that needs more than a record holds raises :class:`NotDerivableError`.

Prescoring: ExpectedAttention would make a record keep every layer's whole hidden states (32 GiB at 128K tokens on
Llama-3.1-8B in bf16). A record made with ``prescore`` (:func:`prescored_scorers` of the presses) computes its scores
while the prefill runs instead and pins them in the record's memo (one ``(batch, kv_heads, tokens)`` tensor per
layer): in one pass by kvpress's own ``score`` on the layer's whole input, so every derived cache is bit for bit
the one a record of every hidden state gives; in a chunked prefill from the query moments each chunk adds to
(:mod:`ripplekv.inference.query_moments`), equal to it up to the rounding of the model's dtype (tested: the same
kept tokens). The presses that score through the memo (the schedules, the per-prompt presses, and ``make_press``'s
AdaKV, whose scorer is a :class:`~ripplekv.presses.memoized_scorer_press.MemoizedScorerPress`) then need none of
the hidden states for it; a kvpress AdaKV built around a bare scorer calls it itself and still needs them all, and a
pinned score asked for other key tensors raises instead of being recomputed from the tail.

Chunked prefill: a prompt longer than ``prefill_chunk`` (default
:data:`~ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK`, 8,192 tokens) is recorded in chunks of at most that
many tokens over its growing cache, so the prefill holds one chunk's activations on top of the cache instead of the
whole prompt's. kvpress's hook only acts on a first pass, so :class:`RecordingPress` records each chunk's pass
itself: the positions of the chunk that fall in the kept tail, their kwargs cut the same way and their attention
weights. :meth:`RecordingPress.assemble` joins them into the one-pass record: the hidden states and the per-query
kwargs concatenated over the chunks, each chunk's attention weights and 4D mask padded to the prompt's keys as one
pass has them (zero weight, masked key), tensors every layer shares joined once. The keys and values are the
cache the chunks filled (one buffer per layer, :class:`~ripplekv.models.cache.ReservedLayer`). Residual statistics
are :class:`~ripplekv.allocation.per_prompt.TokenStatistic` values: per-token values of every chunk, reduced once
over the prompt (SqueezeAttention's mean over tokens, never a mean of chunk means). Since presses score at
derivation, from the record, chunk boundaries change nothing they see; the record equals a one-pass record up to
float rounding (tested tensor for tensor, and every derivable method keeps the same tokens), and a prompt within
the chunk is recorded in one pass, bit for bit as without chunking.

Every compressed cache derived from a record holds new tensors (``gather``) or, for layers a press leaves whole
(the full cache, AdaKV's masked layers), the record's own tensors by reference. Passes over a derived cache never
write into the record; :func:`lean_extend`, :func:`lean_greedy_decode` and :func:`lean_teacher_forced_logprobs`
run them over :class:`OverlayLayer` forks, which keep the cache by reference and the appended tokens apart (a
``DynamicLayer`` fork would keep a concatenated copy of every layer, one more full cache over the full or an
AdaKV cache, for as long as the pass lasts). They hand attention the very tensors the copying passes do, so results
are unchanged under every attention implementation. (The shared-prefix attention of
:mod:`ripplekv.models.shared_prefix` avoids even the one-layer concatenation, but it is given one layer's prefix per
call, which a whole-model forward cannot pass per layer, and it rounds differently from the stock kernels.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    PyramidKVPress,
    QFilterPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.inference.fidelity import logprob_rows
from ripplekv.inference.generate import Prefill, greedy_decode, prefill
from ripplekv.inference.module_state import ModuleState, applied_state, capture_state
from ripplekv.inference.query_moments import MomentsExpectedAttentionPress, QueryMoments
from ripplekv.models.cache import OverlayLayer, cache_from_tensors, lean_fork
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, chunk_bounds, prefill_in_chunks
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.memoized_scorer_press import MemoizedScorerPress
from ripplekv.presses.registry import check_prompt_length
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.presses.score_memo import ScoreMemo, memoized, scorer_key

__all__ = [
    "HIDDEN_STATES_ATTRIBUTE",
    "PRESCORABLE",
    "LayerRecord",
    "NotDerivableError",
    "OverlayLayer",
    "PrefillRecord",
    "RecordingPress",
    "compress_recorded",
    "compressed_prefill_in_chunks",
    "derive_cache",
    "derived_prefill",
    "hidden_states_needed",
    "hidden_states_tail",
    "is_derivable",
    "lean_extend",
    "lean_fork",
    "lean_greedy_decode",
    "lean_teacher_forced_logprobs",
    "prescored_scorers",
    "record_prefill",
    "residual_statistics_of",
]

# Forward kwargs of the attention layer that are not recorded: the live cache (a derived cache is being built
# instead) and the hidden states (recorded as their own field).
_NOT_RECORDED = frozenset({"hidden_states", "past_key_values", "past_key_value"})

HIDDEN_STATES_ATTRIBUTE = "hidden_states_tail"
"""A press may declare, as this attribute (or property), how many of the last prompt positions of the hidden
states its ``compress`` reads: an int >= 0, or None for all of them. It overrides :func:`hidden_states_needed`'s
table, and a subclass of a listed press that reads more must declare it."""

_UNDECLARED = object()


def _snapkv_tail(press: Any) -> int:
    # score() reads hidden_states[:, -window_size:] (and position_embeddings cut the same way) and checks
    # hidden_states.shape[1] > window_size
    return int(press.window_size) + 1


# What the score (or compress) of these exact classes reads of the hidden states: the last n positions, or None
# for all of them. A subclass is not matched: it may read more, and declares HIDDEN_STATES_ATTRIBUTE instead.
_SCORER_TAILS: dict[type, Callable[[Any], int | None]] = {
    SnapKVPress: _snapkv_tail,
    PyramidKVPress: _snapkv_tail,  # SnapKV's score, its own per-layer counts
    TOVAPress: lambda press: 1,  # the last query's attention (compute_window_attention with a window of 1)
    KnormPress: lambda press: 0,  # keys only
    KeyDiffPress: lambda press: 0,
    StreamingLLMPress: lambda press: 0,  # positions only
    QFilterPress: lambda press: 0,
    RandomPress: lambda press: 0,
    ExpectedAttentionPress: lambda press: None,  # query mean and covariance over every position after the sinks
    FullPress: lambda press: 0,
}
# Presses whose compress reads the hidden states only through their wrapped ``press``'s score.
_WRAPPERS: tuple[type, ...] = (
    AdaKVPress,
    GlobalLayersPress,
    LayerBudgetPress,
    LayerBudgetAdaPress,
    MemoizedScorerPress,
    RippleKVPress,
)
# Wrappers that score through ``token_scores`` (the record's memo, where prescored scores are found); kvpress's AdaKV
# calls its scorer's ``score`` itself (through the memo when that scorer is a MemoizedScorerPress, as make_press
# builds it), and GlobalLayersPress hands the layer to its press.
_MEMO_SCORING: tuple[type, ...] = (LayerBudgetPress, LayerBudgetAdaPress, MemoizedScorerPress, RippleKVPress)

PRESCORABLE: frozenset[type[ScorerPress]] = frozenset({ExpectedAttentionPress})
"""Scorers (exact types) whose scores read every prompt position's hidden states, which a record can compute while
the prefill runs instead of keeping those hidden states (:func:`record_prefill`'s ``prescore``)."""


def _prescored(scorer: BasePress, prescored: Collection[Hashable]) -> bool:
    return type(scorer) in PRESCORABLE and scorer_key(scorer) in prescored  # type: ignore[arg-type]


def hidden_states_needed(press: BasePress, prescored: Collection[Hashable] = frozenset()) -> int | None:
    """How many of the last prompt positions of each layer's input hidden states ``press.compress`` reads.

    A press's own declaration (:data:`HIDDEN_STATES_ATTRIBUTE`) comes first; then kvpress's scorers and RippleKV's
    presses as read from their code (see the module docstring; wrappers answer for their wrapped scorer); any
    other press reads them all. A scorer whose scores the record computed while it ran (``prescored``) reads none
    when its wrapper scores through the record's memo (RippleKV's schedules and per-prompt presses, not AdaKV).

    Args:
        press: a press.
        prescored: :func:`~ripplekv.presses.score_memo.scorer_key` of the scorers a record prescored
            (:attr:`PrefillRecord.prescored`).

    Returns:
        The number of trailing positions (0: none), or None for the whole prompt.
    """
    declared = getattr(press, HIDDEN_STATES_ATTRIBUTE, _UNDECLARED)
    if declared is not _UNDECLARED:
        if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 0):
            raise ValueError(
                f"{type(press).__name__}.{HIDDEN_STATES_ATTRIBUTE} must be an int >= 0 or None, got {declared!r}"
            )
        return declared
    kind = type(press)
    if kind in _MEMO_SCORING and _prescored(press.press, prescored):
        return 0
    if kind in _WRAPPERS:
        return hidden_states_needed(press.press, prescored)  # AdaKV's scorer answers for itself: all positions
    if getattr(press, "derives_all_layers", False):  # a per-prompt press: its scorer's, and its window's statistics
        inner = 0 if _prescored(press.press, prescored) else hidden_states_needed(press.press)
        return None if inner is None else max(inner, int(press.window) + 1)
    rule = _SCORER_TAILS.get(kind)
    return None if rule is None else rule(press)


def hidden_states_tail(presses: Iterable[BasePress], prescore: Iterable[ScorerPress] = ()) -> int | None:
    """The ``hidden_tail`` a record needs to derive every one of ``presses``: the most any needs, None for all.

    Args:
        presses: the presses that will be derived from the record.
        prescore: the scorers the record will prescore (:func:`prescored_scorers`, passed to
            :func:`record_prefill`): their presses need none of the hidden states.
    """
    prescored = frozenset(scorer_key(s) for s in prescore)
    most = 0
    for press in presses:
        need = hidden_states_needed(press, prescored)
        if need is None:
            return None
        most = max(most, need)
    return most


def prescored_scorers(presses: Iterable[BasePress]) -> tuple[ScorerPress, ...]:
    """The scorers of ``presses`` a record should prescore: those of :data:`PRESCORABLE` that a press scores
    through the record's memo, one per :func:`~ripplekv.presses.score_memo.scorer_key`.

    Args:
        presses: the presses that will be derived from the record.
    """
    found: dict[Hashable, ScorerPress] = {}

    def visit(press: BasePress) -> None:
        if getattr(press, HIDDEN_STATES_ATTRIBUTE, _UNDECLARED) is not _UNDECLARED:
            return
        kind = type(press)
        memo_scored = kind in _MEMO_SCORING or getattr(press, "derives_all_layers", False)
        inner = getattr(press, "press", None)
        if memo_scored and type(inner) in PRESCORABLE:
            found.setdefault(scorer_key(inner), inner)  # type: ignore[arg-type]
        elif kind in _WRAPPERS and inner is not None:
            visit(inner)

    for press in presses:
        visit(press)
    return tuple(found.values())


class NotDerivableError(ValueError):
    """A press whose compressed cache cannot be derived from a prefill record (prefill with it directly)."""


class _RecordedKwargs(dict):
    """The recorded forward kwargs; reading one that was not recorded raises :class:`NotDerivableError`."""

    def __missing__(self, key: str) -> Any:
        raise NotDerivableError(f"compress reads kwargs[{key!r}], which a prefill record does not hold")


@dataclass(frozen=True)
class LayerRecord:
    """What one layer's ``compress`` received during the recorded prefill (all tensors by reference)."""

    module: nn.Module
    hidden_states: torch.Tensor  # (batch, tail, hidden): the attention layer's input at the last `tail` positions
    keys: torch.Tensor  # (batch, kv_heads, tokens, head_dim): the full cache of the layer
    values: torch.Tensor
    attentions: torch.Tensor | None  # attention weights when the implementation returns them (eager), else None
    kwargs: Mapping[str, Any]  # forward kwargs (position_embeddings, attention_mask, cache_position, ...)
    statistics: Mapping[str, Any] = field(default_factory=dict)  # per-layer statistics computed while prefilling


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


@dataclass(frozen=True)
class _Piece:
    """What one chunk's pass gave one layer at the prompt positions ``[first, end)`` a chunked record keeps."""

    module: nn.Module
    first: int
    end: int
    hidden_states: torch.Tensor
    attentions: torch.Tensor | None
    kwargs: dict[str, Any]


def _token_tensors(values: Sequence[Any], pieces: Sequence[_Piece], dim: int) -> bool:
    """Whether every value is a tensor indexed along ``dim`` by its piece's positions."""
    for value, piece in zip(values, pieces):
        if not isinstance(value, torch.Tensor) or value.dim() < (dim + 1 if dim >= 0 else -dim):
            return False
        if value.shape[dim] != piece.end - piece.first:
            return False
    return True


@dataclass
class RecordingPress(BasePress):
    """A press that compresses nothing and records, per layer, what ``compress`` receives.

    In one pass (a prompt prefilled at once) it records in ``compress``. In a chunked prefill (see
    :func:`record_prefill`) kvpress's hook compresses the first chunk only, so this press's own hook records every
    chunk's pass instead (:meth:`begin_chunk` says which positions it runs) and :meth:`assemble` joins the chunks
    into what one pass would have recorded.

    Args:
        hidden_tail: keep the last ``hidden_tail`` positions of the hidden states (and of the kwargs and attention
            weights indexed by query position), copied out so the layer's whole hidden states are freed; None
            keeps them all, by reference.
        prescore: scorers of :data:`PRESCORABLE` whose scores are computed while the prefill runs and pinned in
            ``memo``: in one pass by their own ``score`` on the layer's whole input; in chunks from the query
            moments each chunk adds to (:class:`~ripplekv.inference.query_moments.QueryMoments`), scored when the
            chunks are assembled.
        memo: where the prescored scores are held (the record's memo).
    """

    hidden_tail: int | None = None
    prescore: tuple[ScorerPress, ...] = ()
    memo: ScoreMemo = field(default_factory=ScoreMemo, repr=False)
    layers: dict[int, LayerRecord] = field(default_factory=dict)
    _moments: dict[int, dict[int, QueryMoments]] = field(default_factory=dict, repr=False)  # layer -> n_sink -> ...
    _cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    _chunk: tuple[int, int, int] | None = field(default=None, repr=False)  # (start, end, prompt tokens)
    _pieces: dict[int, list[_Piece]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        tail = self.hidden_tail
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise ValueError(f"hidden_tail must be an int >= 0 or None, got {tail!r}")
        self.prescore = tuple(self.prescore)
        for scorer in self.prescore:
            if type(scorer) not in PRESCORABLE or scorer_key(scorer) is None:
                names = ", ".join(sorted(kind.__name__ for kind in PRESCORABLE))
                raise ValueError(f"a record prescores {names} only (exact types), not {type(scorer).__name__}")

    def _prescore(
        self,
        key: Hashable,
        scorer: ScorerPress,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> None:
        """Pin ``scorer.score(...)`` of this layer in the memo under ``key`` (the prescored scorer's)."""
        scores = scorer.score(module, hidden_states, keys, values, attentions, kwargs)  # type: ignore[arg-type]
        self.memo.pin("scores", key, int(module.layer_idx), keys, scores)

    def _cut(self, tensor: torch.Tensor, dim: int, start: int) -> torch.Tensor:
        """``tensor`` from entry ``start`` on along ``dim``, copied once per tensor (shared by the layers)."""
        held = self._cuts.get(id(tensor))
        if held is None or held[0] is not tensor:
            held = (tensor, tensor.narrow(dim, start, tensor.shape[dim] - start).clone())
            self._cuts[id(tensor)] = held
        return held[1]

    def _cut_kwarg(self, key: str, value: Any, tokens: int, start: int) -> Any:
        """A kwarg of a pass over ``tokens`` queries, from query ``start`` on where it is indexed by query."""
        if key == "position_embeddings" and isinstance(value, tuple):
            return tuple(self._cut(t, 1, start) if t.dim() >= 2 and t.shape[1] == tokens else t for t in value)
        if key in ("position_ids", "cache_position") and isinstance(value, torch.Tensor) and value.shape[-1] == tokens:
            return self._cut(value, value.dim() - 1, start)
        if key == "attention_mask" and isinstance(value, torch.Tensor) and value.dim() == 4:
            return self._cut(value, 2, start) if value.shape[2] == tokens else value
        return value

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for scorer in self.prescore:  # on the layer's whole input, before it is cut to the tail
            self._prescore(scorer_key(scorer), scorer, module, hidden_states, keys, values, attentions, kwargs)
        recorded = {key: value for key, value in kwargs.items() if key not in _NOT_RECORDED}
        tokens = hidden_states.shape[1]
        if self.hidden_tail is not None and self.hidden_tail < tokens:
            tail = self.hidden_tail
            hidden_states = hidden_states[:, tokens - tail :].clone()
            if attentions is not None:
                attentions = attentions[..., tokens - tail :, :].clone()
            recorded = {key: self._cut_kwarg(key, value, tokens, tokens - tail) for key, value in recorded.items()}
        self.layers[module.layer_idx] = LayerRecord(module, hidden_states, keys, values, attentions, recorded)
        return keys, values

    # ------------------------------------------------------------------------------------------- chunked prefill

    def begin_chunk(self, start: int, end: int, tokens: int) -> None:
        """Record the next pass as the chunk ``[start, end)`` of a ``tokens``-token prompt.

        Args:
            start: the chunk's first prompt position.
            end: one past its last.
            tokens: the whole prompt's length.
        """
        if not 0 <= start < end <= tokens:
            raise ValueError(f"chunk [{start}, {end}) is not a non-empty part of a {tokens}-token prompt")
        self._chunk = (start, end, tokens)

    def forward_hook(self, module: nn.Module, input: list, kwargs: dict, output: list) -> list:
        """kvpress's hook in one pass; in a chunked prefill, record this chunk's positions within the tail."""
        if self._chunk is None:
            return super().forward_hook(module, input, kwargs, output)
        start, end, tokens = self._chunk
        moments = self._moments.setdefault(module.layer_idx, {})
        for n_sink in dict.fromkeys(int(scorer.n_sink) for scorer in self.prescore):  # type: ignore[attr-defined]
            moments.setdefault(n_sink, QueryMoments(n_sink)).update(module, kwargs["hidden_states"], start)
        first = start if self.hidden_tail is None else min(end, max(start, tokens - self.hidden_tail))
        if first == end and end < tokens:  # nothing of this chunk is kept (the last chunk always gives a piece)
            return output
        local = first - start
        hidden = kwargs["hidden_states"]
        attentions = output[1] if len(output) > 1 else None
        recorded = {key: value for key, value in kwargs.items() if key not in _NOT_RECORDED}
        if local:  # copied out, so the chunk's own tensors are freed
            hidden = hidden[:, local:].clone()
            if attentions is not None:
                attentions = attentions[..., local:, :].clone()
            recorded = {key: self._cut_kwarg(key, value, end - start, local) for key, value in recorded.items()}
        pieces = self._pieces.setdefault(module.layer_idx, [])
        pieces.append(_Piece(module, first, end, hidden, attentions, recorded))
        return output

    def assemble(self, cache: DynamicCache, tokens: int) -> None:
        """Join the recorded chunks into one :class:`LayerRecord` per layer, over ``cache``'s keys and values.

        The hidden states, the kwargs indexed by query position and the attention weights of the kept positions
        are concatenated along the query positions. A chunk's attention weights and 4D attention mask span the keys
        up to its end; they are padded to the prompt's keys as a one-pass prefill has them: zero weight, masked key
        (``False``, or the dtype's minimum in an additive mask). A chunk whose pass had no mask (its queries see
        every key up to their own) gets those rows made explicit when another chunk's pass had one. Tensors every
        layer shares (position embeddings, masks) are joined once and shared. Any other kwarg is the last chunk's.

        Args:
            cache: the cache the chunked prefill filled.
            tokens: the prompt's length.
        """
        memo: dict[tuple[int, ...], tuple[Any, torch.Tensor]] = {}

        def shared(key: tuple[int, ...], inputs: Any, make: Callable[[], torch.Tensor]) -> torch.Tensor:
            held = memo.get(key)
            if held is None:
                held = (inputs, make())  # the inputs are held so that their ids stay theirs
                memo[key] = held
            return held[1]

        def join(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
            if len(parts) == 1:
                return parts[0]
            return shared((0, dim, *map(id, parts)), parts, lambda: torch.cat(list(parts), dim=dim))

        def padded(tensor: torch.Tensor, fill: bool | float) -> torch.Tensor:
            room = tokens - tensor.shape[-1]
            if not room:
                return tensor
            return shared((1, id(tensor)), tensor, lambda: F.pad(tensor, (0, room), value=fill))

        def masked_value(mask: torch.Tensor) -> bool | float:
            return False if mask.dtype == torch.bool else torch.finfo(mask.dtype).min

        rows_made: dict[tuple[Any, ...], torch.Tensor] = {}

        def visible(piece: _Piece, like: torch.Tensor) -> torch.Tensor:
            """The mask rows of a pass that had none: query ``p`` sees the keys ``<= p`` (made once, shared)."""
            key = (piece.first, piece.end, like.dtype, like.device)
            if key not in rows_made:
                rows = torch.arange(piece.first, piece.end, device=like.device).unsqueeze(1)
                allowed = torch.arange(piece.end, device=like.device).unsqueeze(0) <= rows
                allowed = allowed.view(1, 1, piece.end - piece.first, piece.end)
                if like.dtype != torch.bool:
                    allowed = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device).masked_fill(
                        ~allowed, masked_value(like)
                    )
                rows_made[key] = allowed
            return rows_made[key]

        def join_kwarg(key: str, values: list[Any], pieces: list[_Piece]) -> Any:
            if all(value is values[0] for value in values):
                return values[-1]
            if key == "position_embeddings" and all(isinstance(v, tuple) and len(v) == len(values[-1]) for v in values):
                parts = [[v[j] for v in values] for j in range(len(values[-1]))]
                return tuple(join(p, 1) if _token_tensors(p, pieces, 1) else p[-1] for p in parts)
            if key in ("position_ids", "cache_position") and _token_tensors(values, pieces, -1):
                return join(values, -1)
            masks_4d = all(v is None or (isinstance(v, torch.Tensor) and v.dim() == 4) for v in values)
            if key == "attention_mask" and masks_4d:
                like = next(v for v in values if v is not None)
                masks = [visible(p, like) if v is None else v for v, p in zip(values, pieces)]
                if _token_tensors(masks, pieces, 2):
                    return join([padded(m, masked_value(like)) for m in masks], 2)
            return values[-1]

        for index, pieces in sorted(self._pieces.items()):
            attentions = None
            if any(p.attentions is not None for p in pieces):
                if not all(p.attentions is not None for p in pieces):
                    raise ValueError(f"layer {index} returned attention weights in some chunks of the prefill only")
                attentions = join([padded(p.attentions, 0.0) for p in pieces], -2)  # type: ignore[arg-type]
            last = pieces[-1]
            kwargs = {key: join_kwarg(key, [p.kwargs.get(key) for p in pieces], pieces) for key in last.kwargs}
            layer = cache.layers[index]
            hidden = join([p.hidden_states for p in pieces], 1)
            self.layers[index] = LayerRecord(last.module, hidden, layer.keys, layer.values, attentions, kwargs)
            for scorer in self.prescore:  # scored from the whole prompt's query moments, kvpress's score otherwise
                config = {f.name: getattr(scorer, f.name) for f in fields(scorer) if f.init}
                moments = self._moments[index][int(scorer.n_sink)]  # type: ignore[attr-defined]
                from_moments = MomentsExpectedAttentionPress(**config, moments=moments, prompt_tokens=tokens)
                self._prescore(
                    scorer_key(scorer), from_moments, last.module, hidden, layer.keys, layer.values, attentions, kwargs
                )
        self._pieces.clear()
        self._moments.clear()
        self._chunk = None


def record_prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    hidden_tail: int | None = None,
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
        hidden_tail: hidden states kept per layer, the last ``hidden_tail`` positions (None: all of them). Pass
            :func:`hidden_states_tail` of every press to be derived: the record then holds what they read and no
            more (see the module docstring).
        residual_statistics: per-layer statistics of the residual stream, computed while the prefill runs and kept
            in each :class:`LayerRecord`'s ``statistics`` under their name: ``fn(residual_in, attention_output)``
            of the decoder layer's input and its attention output, both ``(batch, tokens, hidden)`` (what a
            per-prompt press such as SqueezeAttention reads and a record of the attention's inputs cannot give).
            Each layer's tensors are released as soon as its statistics are computed. A chunked prefill needs each
            to be a :class:`~ripplekv.allocation.per_prompt.TokenStatistic` (per-token values of every chunk,
            reduced once over the whole prompt; :func:`residual_statistics_of` gives them), else raises ValueError.
        prefill_chunk: most tokens per prefill pass (an integer >= 1; default
            :data:`~ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK`); None: one pass whatever the length.
        prescore: scorers of :data:`PRESCORABLE` (ExpectedAttention) to score while the prefill runs, so the record
            need not keep the whole prompt's hidden states for them (:func:`prescored_scorers` of the presses to
            derive; pass the same to :func:`hidden_states_tail`). In one pass each layer is scored by the scorer's
            own ``score`` on its whole input, exactly as deriving from every hidden state; in chunks from the
            prompt's query moments (:mod:`ripplekv.inference.query_moments`), equal to it up to the rounding of
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
    press._cuts.clear()
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


def is_derivable(press: BasePress) -> bool:
    """Static part of the rule (see the module docstring): default hook and context manager, no opt-out.

    :func:`compress_recorded` also checks, on every call, that ``compress`` writes no module state and no
    recorded tensor and reads only recorded kwargs.
    """
    if not getattr(press, "derivable_from_record", True):
        return False
    if getattr(press, "derives_all_layers", False):  # a per-prompt press derives every layer at once (``derive``)
        return True
    cls = type(press)
    return cls.forward_hook is BasePress.forward_hook and cls.__call__ is BasePress.__call__


def _tensor_versions(layer: LayerRecord) -> list[int]:
    tensors = [layer.hidden_states, layer.keys, layer.values]
    if layer.attentions is not None:
        tensors.append(layer.attentions)
    return [t._version for t in tensors]


@torch.no_grad()
def derive_cache(record: PrefillRecord, press: BasePress) -> tuple[DynamicCache, tuple[ModuleState, ...]]:
    """The cache ``prefill(model, ids, press)`` would have built, and the attention-module state it set.

    Calls ``press.post_init_from_model(model)`` first (RippleKV checks its profile there), then
    ``press.compress`` layer by layer on the recorded inputs. Attributes ``compress`` sets on a layer's attention
    module (AdaKV's ``masked_key_indices``) are captured into the returned state and the module is restored at
    once, so no configuration sees another's state. Raises :class:`NotDerivableError` for a press that cannot be
    derived (see the module docstring).

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    if record.invalid is not None:
        raise NotDerivableError(f"the prefill record is no longer valid: {record.invalid}")
    if not is_derivable(press):
        raise NotDerivableError(
            f"{type(press).__name__} overrides the kvpress forward hook or context manager (or opts out): "
            "its cache cannot be derived from a prefill record"
        )
    check_prompt_length(press, record.prompt_tokens)
    held = record.hidden_tokens
    if held < record.prompt_tokens:
        need = hidden_states_needed(press, record.prescored)
        if need is None or need > held:
            reads = "every prompt position" if need is None else f"the last {need} prompt positions"
            raise NotDerivableError(
                f"{type(press).__name__} reads {reads} of the hidden states, but the record holds the last {held} of "
                f"{record.prompt_tokens}: record with record_prefill(..., hidden_tail=hidden_states_tail(presses)) "
                "over every press to derive (None keeps them all)"
            )
    press.post_init_from_model(record.model)
    with memoized(record.memo):  # a scorer's scores (a rule's statistics) computed once per record
        return _derive(record, press)


def _derive(record: PrefillRecord, press: BasePress) -> tuple[DynamicCache, tuple[ModuleState, ...]]:
    if getattr(press, "derives_all_layers", False):  # statistics of every layer first, then every layer's budget
        versions = [_tensor_versions(layer) for layer in record.layers]
        captured: list[ModuleState] = []  # module state derive sets (LavaPress's head-wise masks), modules restored
        with capture_state([layer.module for layer in record.layers], captured):
            pairs = press.derive(record.layers, record.model.config)
        if [_tensor_versions(layer) for layer in record.layers] != versions:
            record.invalid = f"{type(press).__name__}.derive wrote into the recorded tensors in place"
            raise NotDerivableError(record.invalid)
        return cache_from_tensors(pairs), tuple(captured)
    pairs = []
    states: list[ModuleState] = []
    for index, layer in enumerate(record.layers):
        versions = _tensor_versions(layer)
        kwargs = _RecordedKwargs(layer.kwargs)
        captured: list[ModuleState] = []
        with capture_state([layer.module], captured):
            keys, values = press.compress(
                layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, kwargs
            )
        if _tensor_versions(layer) != versions:
            record.invalid = f"{type(press).__name__}.compress wrote into the recorded tensors in place"
            raise NotDerivableError(record.invalid)
        states.extend(ModuleState(index, state.module, state.attributes) for state in captured)
        pairs.append((keys, values))
    return cache_from_tensors(pairs), tuple(states)


def compress_recorded(record: PrefillRecord, press: BasePress) -> DynamicCache:
    """The cache ``prefill(model, ids, press)`` would have built, for presses that act through the cache alone.

    A bare cache cannot carry attention-module state: for a press whose ``compress`` sets some (AdaKV) this
    raises :class:`NotDerivableError` (the modules are left as they were); use :func:`derived_prefill`, which
    carries that state with the cache.

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    cache, states = derive_cache(record, press)
    if states:
        names = sorted({name for state in states for name in state.attributes})
        raise NotDerivableError(
            f"{type(press).__name__}.compress sets {', '.join(names)} on the attention modules (state read by later "
            "passes, as AdaKV's masked keys): a bare cache cannot carry it, use derived_prefill"
        )
    return cache


def derived_prefill(record: PrefillRecord, press: BasePress) -> tuple[Prefill, float]:
    """A :class:`Prefill` over the cache derived for ``press``, and the seconds the derivation took.

    Works for every press of :func:`ripplekv.presses.make_press`, AdaKV included: the attention-module state
    ``compress`` set is the result's ``attention_state``, applied during every later pass over it. Its ``seconds``
    is the recorded prefill's time plus the derivation's, what a direct prefill would report.

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    start = time.perf_counter()
    cache, states = derive_cache(record, press)
    seconds = time.perf_counter() - start
    prefill_state = Prefill(cache, record.next_logits, record.prompt_tokens, record.seconds + seconds, states)
    return prefill_state, seconds


def compressed_prefill_in_chunks(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    press: BasePress,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
) -> Prefill:
    """``prefill(model, input_ids, press)`` for a prompt of any length: recorded in chunks, the press's cache derived.

    kvpress compresses inside one pass, so a long prompt under a press would need the whole prompt's activations at
    once. This records it in chunks of at most ``prefill_chunk`` tokens, keeping only what ``press`` reads (the
    hidden-state tail of :func:`hidden_states_tail`, its residual statistics, ExpectedAttention prescored), and
    derives its cache: the prefill holds one chunk's activations over the full cache, then the full cache and the
    compressed one until the record is released on return. A prompt within the chunk is one pass, and the result is
    then the direct prefill's bit for bit (its ``seconds`` also count the derivation).

    Args:
        model: the model.
        input_ids: the prompt, one unpadded sequence of shape ``(1, n)``.
        press: any derivable press (:func:`is_derivable`; every press of :func:`ripplekv.presses.make_press`).
        prefill_chunk: most tokens per prefill pass (default
            :data:`~ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK`); None: one pass.

    Raises:
        NotDerivableError: for a press whose cache cannot be derived from a record.
    """
    if not is_derivable(press):
        raise NotDerivableError(
            f"{type(press).__name__} overrides the kvpress forward hook or context manager (or opts out): it cannot "
            "be prefilled in chunks; prefill it in one pass (ripplekv.inference.generate.prefill)"
        )
    presses = [press]
    prescore = prescored_scorers(presses)
    tail = hidden_states_tail(presses, prescore)
    record = record_prefill(model, input_ids, tail, residual_statistics_of(presses), prefill_chunk, prescore)
    state, _ = derived_prefill(record, press)
    return state


def _positions(state: Prefill, count: int) -> torch.Tensor:
    start = state.prompt_tokens
    return torch.arange(start, start + count, device=state.next_logits.device)


@torch.no_grad()
def lean_extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """:func:`~ripplekv.inference.generate.extend` over a :func:`lean_fork`: ``state``'s cache is not copied.

    The result's cache holds ``state``'s tensors by reference and the new tokens apart (:class:`OverlayLayer`);
    :func:`lean_greedy_decode`, :func:`lean_teacher_forced_logprobs` and
    :func:`~ripplekv.inference.batched.decode_row` take it. Same logits as ``extend``.

    Args:
        model: the model ``state`` was prefilled with.
        state: the prefilled (compressed) prompt; left unchanged.
        input_ids: the new tokens, shape ``(1, n)``.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"expected new tokens of shape (1, n), n >= 1, got {tuple(input_ids.shape)}")
    positions = _positions(state, input_ids.shape[1])
    cache = lean_fork(state.cache)
    start = time.perf_counter()
    with applied_state(model, state.attention_state):
        logits = model(
            input_ids.to(positions.device),
            past_key_values=cache,
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
            logits_to_keep=1,
        ).logits
    seconds = state.seconds + time.perf_counter() - start
    return Prefill(cache, logits[0, -1], int(positions[-1]) + 1, seconds, state.attention_state)


@torch.no_grad()
def lean_teacher_forced_logprobs(model: PreTrainedModel, state: Prefill, tokens: Sequence[int]) -> torch.Tensor:
    """:func:`~ripplekv.inference.fidelity.teacher_forced_logprobs` over a :func:`lean_fork` (same result).

    Args:
        model: the model ``state`` was prefilled with.
        state: the prefilled (compressed) prompt; left unchanged.
        tokens: the forced tokens (at least one).

    Returns:
        ``(len(tokens), vocab)`` float64 log-softmax, on the CPU.
    """
    vocab = state.next_logits.shape[-1]
    ids = [int(t) for t in tokens]
    if not ids or any(not 0 <= t < vocab for t in ids):
        raise ValueError(f"tokens must be a non-empty sequence of ids in [0, {vocab})")
    if len(ids) == 1:
        return logprob_rows(state.next_logits, None)
    positions = _positions(state, len(ids) - 1)
    with applied_state(model, state.attention_state):
        logits = model(
            torch.tensor([ids[:-1]], device=positions.device),
            past_key_values=lean_fork(state.cache),
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
        ).logits
    return logprob_rows(state.next_logits, logits[0])


@torch.no_grad()
def lean_greedy_decode(
    model: PreTrainedModel, state: Prefill, max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0
) -> list[int]:
    """:func:`~ripplekv.inference.generate.greedy_decode` over a :func:`lean_fork` (same tokens).

    Args:
        model: the model ``state`` was prefilled with.
        state: the prefilled (compressed) prompt; left unchanged.
        max_new_tokens: most tokens to generate (>= 1).
        stop_ids: token ids that end the answer (included in it).
        min_new_tokens: for the first ``min_new_tokens`` tokens the stop ids cannot be chosen.
    """
    return greedy_decode(model, state, max_new_tokens, stop_ids, min_new_tokens, fork=lean_fork)
