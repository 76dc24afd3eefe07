"""The press that records a prefill: per layer, exactly what ``compress`` receives, the cache left unchanged."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from kvpress import ExpectedAttentionPress
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import get_prerope_query_states
from torch import nn
from transformers import DynamicCache

from ripplekv.models.attention_functions import CACHE_KWARG
from ripplekv.validation import check_int
from ripplekv_eval.fastpath.hidden_tail import DEFAULT_HIDDEN_TAIL, PRESCORABLE
from ripplekv_eval.fastpath.score_memo import ScoreMemo, scorer_key

# Not recorded: the live cache (a derived cache is built instead) and the hidden states (a field of their own).
_NOT_RECORDED = frozenset({"hidden_states", "past_key_values", "past_key_value", CACHE_KWARG})


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

    ``hidden_tail``: the last query positions kept (hidden states, per-query kwargs, attention weights), copied out so
    the whole are freed (None: all, by reference). ``prescore``: scorers scored as the prefill runs, pinned in
    ``memo``. kvpress's hook compresses only a first pass, so a chunked prefill is recorded by :meth:`forward_hook`
    (:meth:`begin_chunk` names the positions) and joined by :meth:`assemble`.
    """

    hidden_tail: int | None = DEFAULT_HIDDEN_TAIL
    prescore: tuple[ScorerPress, ...] = ()
    memo: ScoreMemo = field(default_factory=ScoreMemo, repr=False)
    layers: dict[int, LayerRecord] = field(default_factory=dict)
    _moments: dict[int, dict[int, QueryMoments]] = field(default_factory=dict, repr=False)  # layer -> n_sink -> ...
    _cuts: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    _chunk: tuple[int, int, int] | None = field(default=None, repr=False)  # (start, end, prompt tokens)
    _pieces: dict[int, list[_Piece]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_int("hidden_tail", self.hidden_tail, 0, allow_none=True)
        self.prescore = tuple(self.prescore)
        for scorer in self.prescore:
            if type(scorer) not in PRESCORABLE or scorer_key(scorer) is None:
                names = ", ".join(sorted(kind.__name__ for kind in PRESCORABLE))
                raise ValueError(f"a record prescores {names} only (exact types), not {type(scorer).__name__}")

    def release(self) -> None:
        """Drop the whole-pass tensors held while recording (kept only so that each is cut once for every layer)."""
        self._cuts.clear()

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

    def begin_chunk(self, start: int, end: int, tokens: int) -> None:
        """Record the next pass as the chunk ``[start, end)`` of a ``tokens``-token prompt."""
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

        Per-query tensors are concatenated; attention weights and 4D masks are padded to ``tokens`` keys as one pass
        has them (a chunk without a mask gets its causal rows). Shared tensors are joined once; any other kwarg is the
        last chunk's.
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


@dataclass
class QueryMoments:
    """Count, mean and centred second moment of one layer's pre-RoPE queries after the first ``n_sink``."""

    n_sink: int
    count: int = 0
    mean: torch.Tensor | None = field(default=None, repr=False)  # (batch, heads, head_dim), float64
    m2: torch.Tensor | None = field(default=None, repr=False)  # (batch, heads, head_dim, head_dim), float64
    dtype: torch.dtype | None = None  # the queries' dtype, which kvpress computes the statistics in

    def __post_init__(self) -> None:
        check_int("n_sink", self.n_sink, 0)

    @torch.no_grad()
    def update(self, module: nn.Module, hidden_states: torch.Tensor, start: int) -> None:
        """Merge the queries of the prompt positions ``[start, start + n)`` that ``hidden_states`` holds."""
        skip = max(0, self.n_sink - start)
        if skip >= hidden_states.shape[1]:
            return
        queries = get_prerope_query_states(module, hidden_states[:, skip:])
        self.dtype = queries.dtype
        queries = queries.to(torch.promote_types(queries.dtype, torch.float32))  # bf16 / fp16 chunks in float32
        n = queries.shape[2]
        chunk_mean = queries.mean(dim=2)
        centred = queries - chunk_mean.unsqueeze(2)
        chunk_m2 = torch.einsum("bhsi,bhsj->bhij", centred, centred).double()
        chunk_mean = chunk_mean.double()
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = n, chunk_mean, chunk_m2
            return
        total = self.count + n
        delta = chunk_mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + chunk_m2 + torch.einsum("bhi,bhj->bhij", delta, delta) * (self.count * n / total)
        self.count = total

    def statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, cov)`` as kvpress's ``get_query_statistics`` computes them before RoPE, in the queries' dtype."""
        if self.mean is None or self.m2 is None or self.dtype is None:
            raise ValueError(f"no query after the first {self.n_sink} prompt positions was merged")
        return self.mean.to(self.dtype), (self.m2 / self.count).to(self.dtype)


@dataclass
class MomentsExpectedAttentionPress(ExpectedAttentionPress):
    """kvpress's ExpectedAttention with its query statistics from :class:`QueryMoments` of the whole prompt, the
    averaged RoPE applied at ``prompt_tokens`` as after a one-pass prefill."""

    moments: QueryMoments | None = None
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moments is None:
            raise ValueError("MomentsExpectedAttentionPress needs the layer's QueryMoments")
        if self.moments.n_sink != self.n_sink:
            raise ValueError(f"the moments leave out {self.moments.n_sink} sink positions, the press {self.n_sink}")
        check_int("prompt_tokens", self.prompt_tokens)

    def get_query_statistics(
        self, module: nn.Module, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The moments' mean and covariance (None without ``use_covariance``), RoPE-averaged at the prompt's end."""
        mu, cov = self.moments.statistics()  # type: ignore[union-attr]
        return self.apply_avg_rope(module, mu, cov if self.use_covariance else None, self.prompt_tokens)
