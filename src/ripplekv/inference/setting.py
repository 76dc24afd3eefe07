"""Choosing RippleKV's ``r`` and ``gamma`` for a profiled model (``ripplekv profile``; docs/method.md, "Choosing r and
gamma").

After the sensitivity pass, each calibration prompt's full-cache prefill serves every candidate: the SnapKV token
scores of its compressed layers are recorded once while it is prefilled (:class:`ScoreRecorder`, a press that keeps
every token), and each candidate's compressed cache is derived from it by the candidate press's own ``compress`` fed
those scores (:func:`derive_cache`: the cache ``prefill(model, ids, make_press("ripplekv:r=R,gamma=G", ...))``
builds). The candidate is scored by KL(full || candidate) over the prompt's teacher-forced continuation, as the
harness's fidelity is (:mod:`ripplekv.inference.teacher_forcing`). Candidates whose per-layer budgets coincide on a
prompt share one cache. The prefills are the sensitivity pass's own where :class:`SettingSelector` could keep them
(it is ``profile_model``'s :class:`~ripplekv.profiling.sensitivity.PrefillHandoff`), else one more per prompt.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.allocation.budget import DEFAULT_GAMMA, DEFAULT_RATIO
from ripplekv.inference.generate import Prefill
from ripplekv.inference.teacher_forcing import mean_kl, teacher_forced_logprobs
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_bytes, cache_from_layers, dynamic_layer, lean_fork
from ripplekv.models.chunked_prefill import prefill_in_chunks
from ripplekv.models.headwise import attention_modules
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.registry import DEFAULT_WINDOW, make_press
from ripplekv.presses.selection_window import scorer_window
from ripplekv.profiling.calibration import CalibrationSet
from ripplekv.profiling.profile import ProfileSetting, SensitivityProfile, SettingCandidate, choose_setting
from ripplekv.profiling.sensitivity import (
    ProfilingConfig,
    calibration_ids,
    greedy_continuation,
    profile_model,
)
from ripplekv.validation import is_integer

__all__ = [
    "DEFAULT_SELECTION_MEMORY",
    "SELECTION_BUDGETS",
    "SELECTION_GAMMAS",
    "SELECTION_RATIOS",
    "PrefilledPrompt",
    "ProfileRun",
    "RecordedScorer",
    "ScoreRecorder",
    "SettingGrid",
    "SettingSelection",
    "SettingSelector",
    "choose_profile_setting",
    "derive_cache",
    "profile_with_setting",
]

SELECTION_RATIOS: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0)
"""The grid of ``r``: the committed ``ripplekv tune`` runs' (2-32; tune's default grid, 1.5-8, lies within its span
but for 1.5, nearly uniform, which no tune run chose), 4 included."""
SELECTION_GAMMAS: tuple[float, ...] = (3.0, 6.0, 12.0, 30.0)
"""The grid of ``gamma``: the committed ``ripplekv tune`` runs' (2-30) from the default 3 up: a clip below 3 was never
the best candidate of any committed tune run at any budget; 3 is the default."""
SELECTION_BUDGETS: tuple[float, ...] = (0.1, 0.2, 0.3)
"""The kept fractions the setting is chosen at (the paper's and every committed comparison's)."""
DEFAULT_SELECTION_MEMORY = 2 * 2**30
"""Bytes of the sensitivity pass's full caches :class:`SettingSelector` keeps for the selection (the others are
prefilled again when the selection runs)."""


def _grid_values(name: str, values: Sequence[float], default: float) -> tuple[float, ...]:
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            raise ValueError(f"{name} must be finite numbers >= 1, got {value!r}")
        out.append(float(value))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty grid without duplicates, got {tuple(values)!r}")
    return tuple(sorted({*out, float(default)}))


@dataclass(frozen=True)
class SettingGrid:
    """The candidates of the selection: every ``(r, gamma)`` of ``ratios`` x ``gammas`` (the defaults r 4 and gamma
    3 always added), scored at each kept fraction of ``budgets`` under SnapKV's scorer with ``window_size``."""

    ratios: tuple[float, ...] = SELECTION_RATIOS
    gammas: tuple[float, ...] = SELECTION_GAMMAS
    budgets: tuple[float, ...] = SELECTION_BUDGETS
    window_size: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratios", _grid_values("ratios", self.ratios, DEFAULT_RATIO))
        object.__setattr__(self, "gammas", _grid_values("gammas", self.gammas, DEFAULT_GAMMA))
        budgets = tuple(self.budgets)
        for budget in budgets:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < 1:
                raise ValueError(f"selection budgets must be kept fractions in (0, 1), got {budget!r}")
        if not budgets or len(set(budgets)) != len(budgets):
            raise ValueError(f"selection budgets must be a non-empty list without duplicates, got {budgets!r}")
        object.__setattr__(self, "budgets", tuple(sorted(float(b) for b in budgets)))
        if not is_integer(self.window_size) or self.window_size < 1:
            raise ValueError(f"window_size must be an integer >= 1, got {self.window_size!r}")

    @property
    def candidates(self) -> tuple[tuple[float, float], ...]:
        """``(r, gamma)`` pairs in grid order: the defaults first, then by ``r``, then ``gamma``."""
        default = (float(DEFAULT_RATIO), float(DEFAULT_GAMMA))
        rest = [(r, g) for r in self.ratios for g in self.gammas if (r, g) != default]
        return (default, *rest)


@dataclass
class ScoreRecorder(BasePress):
    """A kvpress press that keeps every token and records, per compressed layer, the scores ``press`` gives them: what
    a :class:`~ripplekv.presses.layer_budget_press.LayerBudgetPress` over that scorer ranks (a ratio-free scorer)."""

    press: ScorerPress = field(default_factory=SnapKVPress)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        window = scorer_window(self.press)
        if module.layer_idx in compressed_layers(module.config) and keys.shape[2] > window:
            self.scores[module.layer_idx] = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        return keys, values


@dataclass
class RecordedScorer(ScorerPress):
    """A scorer that hands back the scores a :class:`ScoreRecorder` recorded, for the keys they were computed from
    (ValueError for a layer without them); ``window_size`` is the recorded scorer's, the floor of a layer's budget."""

    scores: Mapping[int, torch.Tensor] = field(default_factory=dict)
    window_size: int = DEFAULT_WINDOW

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> torch.Tensor:
        found = self.scores.get(module.layer_idx)
        if found is None or found.shape[-1] != keys.shape[2]:
            raise ValueError(f"no recorded scores of layer {module.layer_idx} for its {keys.shape[2]} keys")
        return found


@dataclass(frozen=True)
class PrefilledPrompt:
    """A calibration prompt prefilled once: its full cache (never written), the ``(vocab,)`` logits after it, the
    recorded token scores of its compressed layers and the continuation teacher-forced over it."""

    index: int
    cache: DynamicCache
    next_logits: torch.Tensor
    scores: Mapping[int, torch.Tensor]
    continuation: tuple[int, ...]
    prompt_tokens: int


@torch.no_grad()
def record_prefill(
    model: PreTrainedModel, context_ids: torch.Tensor, window_size: int
) -> tuple[DynamicCache, torch.Tensor, dict[int, torch.Tensor]]:
    """The one-pass full-cache prefill of ``context_ids`` ``(1, n)``, its last ``(1, 1, vocab)`` logits and SnapKV's
    scores (window ``window_size``) of every compressed layer, recorded as it ran."""
    recorder = ScoreRecorder(SnapKVPress(window_size=window_size))
    with recorder(model):
        cache, logits = prefill_in_chunks(model, context_ids, None)
    return cache, logits, recorder.scores


def derive_cache(press: LayerBudgetPress, prompt: PrefilledPrompt, model: PreTrainedModel) -> DynamicCache:
    """The cache ``press`` keeps of ``prompt``: its own ``compress`` per layer over the full cache, ranking by the
    recorded scores (the cache a prefill with ``press`` builds; ``press``'s scorer must be the recorded one)."""
    deriving = copy.copy(press)  # the caller's press keeps its scorer
    deriving.press = RecordedScorer(scores=prompt.scores, window_size=press.window_size)
    layers = []
    for module, layer in zip(attention_modules(model), prompt.cache.layers, strict=True):
        keys, values = deriving.compress(module, None, layer.keys, layer.values, None, {})  # type: ignore[arg-type]
        layers.append(dynamic_layer(keys, values))
    return cache_from_layers(layers)


@dataclass(frozen=True)
class SettingSelection:
    """A selection's setting and what it cost: ``seconds`` (its own work, prefills it had to repeat included),
    ``reused`` prompts whose sensitivity-pass prefill served, ``prefilled`` prompts prefilled again, ``caches``
    compressed caches teacher-forced (distinct budget vectors, SnapKV's included)."""

    setting: ProfileSetting
    seconds: float
    reused: int
    prefilled: int
    caches: int


class SettingSelector:
    """Chooses a profile's setting (:meth:`select`). As ``profile_model``'s
    :class:`~ripplekv.profiling.sensitivity.PrefillHandoff` it prefills each calibration prompt in one pass while
    recording its SnapKV scores, and keeps the prefill for the selection while the kept caches take at most ``memory``
    bytes (None: no limit); a prompt longer than the profiling chunk is prefilled as profiling would and not kept."""

    def __init__(self, grid: SettingGrid | None = None, memory: int | None = DEFAULT_SELECTION_MEMORY) -> None:
        if memory is not None and (not is_integer(memory) or memory < 0):
            raise ValueError(f"memory must be an integer >= 0 (bytes) or None, got {memory!r}")
        self.grid = grid or SettingGrid()
        self.memory = memory
        self._kept: dict[int, PrefilledPrompt] = {}
        self._bytes = 0
        self._recorded: tuple[int, dict[int, torch.Tensor]] | None = None

    @property
    def kept(self) -> int:
        """Prompts whose prefill is kept for the selection."""
        return len(self._kept)

    def prefill(
        self, model: PreTrainedModel, context_ids: torch.Tensor, prefill_chunk: int | None
    ) -> tuple[DynamicCache, torch.Tensor]:
        """Profiling's prefill of ``context_ids``, its SnapKV scores recorded when it runs in one pass."""
        tokens = int(context_ids.shape[1])
        self._recorded = None
        if (prefill_chunk is not None and tokens > prefill_chunk) or tokens <= self.grid.window_size:
            return prefill_in_chunks(model, context_ids, prefill_chunk)
        cache, logits, scores = record_prefill(model, context_ids, self.grid.window_size)
        self._recorded = (tokens, scores)
        return cache, logits

    def keep(
        self, sample_index: int, cache: DynamicCache, next_logits: torch.Tensor, continuation_ids: torch.Tensor
    ) -> None:
        """Keep a scored sample's prefill for :meth:`select` if it was recorded and fits in ``memory``."""
        recorded, self._recorded = self._recorded, None
        if recorded is None:
            return
        size = cache_bytes(cache)
        if self.memory is not None and self._bytes + size > self.memory:
            return
        tokens, scores = recorded
        continuation = tuple(int(t) for t in continuation_ids.reshape(-1).tolist())
        self._kept[int(sample_index)] = PrefilledPrompt(
            int(sample_index), cache, next_logits.reshape(-1), scores, continuation, tokens
        )
        self._bytes += size

    def release(self) -> None:
        """Drop every kept prefill."""
        self._kept.clear()
        self._bytes = 0

    @torch.no_grad()
    def _prefill_again(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        calibration: CalibrationSet,
        index: int,
        config: ProfilingConfig,
    ) -> PrefilledPrompt | None:
        """Sample ``index`` prefilled for the selection (None when its context is not longer than the window)."""
        context_ids, continuation_ids = calibration_ids(model, tokenizer, calibration.samples[index], config)
        tokens = int(context_ids.shape[1])
        if tokens <= self.grid.window_size:
            return None
        device = next(model.parameters()).device
        cache, logits, scores = record_prefill(model, context_ids.to(device), self.grid.window_size)
        next_logits = logits[0, -1]
        if continuation_ids is None:  # the model's own answer, as profiling decoded it
            continuation_ids = greedy_continuation(
                model, lean_fork(cache), next_logits[None], tokens, config.answer_tokens
            )
        continuation = tuple(int(t) for t in continuation_ids.reshape(-1).tolist())
        return PrefilledPrompt(index, cache, next_logits, scores, continuation, tokens)

    @torch.no_grad()
    def score_prompt(
        self, model: PreTrainedModel, prompt: PrefilledPrompt, profile: SensitivityProfile
    ) -> tuple[list[list[float]], list[float], int]:
        """``(kl, snapkv, caches)``: ``kl[b][c]`` of candidate ``c`` at budget ``b`` on ``prompt``, uniform SnapKV's
        KL at each budget, and how many caches were teacher-forced."""
        grid, tokens = self.grid, list(prompt.continuation)
        full = Prefill(prompt.cache, prompt.next_logits, prompt.prompt_tokens, 0.0)
        reference = teacher_forced_logprobs(model, full, tokens, fork=lean_fork)

        def kl_of(press: LayerBudgetPress) -> float:
            cache = derive_cache(press, prompt, model)
            state = Prefill(cache, prompt.next_logits, prompt.prompt_tokens, 0.0)
            return mean_kl(reference, teacher_forced_logprobs(model, state, tokens, fork=lean_fork))

        kl: list[list[float]] = []
        snapkv: list[float] = []
        caches = 0
        for budget in grid.budgets:
            uniform = make_press("snapkv", budget=budget, window_size=grid.window_size)
            uniform.post_init_from_model(model)
            snapkv.append(kl_of(uniform))
            groups: dict[tuple[int, ...], list[int]] = {}
            presses: dict[tuple[int, ...], LayerBudgetPress] = {}
            for index, (ratio, gamma) in enumerate(grid.candidates):
                press = make_press(
                    "ripplekv", budget=budget, profile=profile, window_size=grid.window_size, ratio=ratio, gamma=gamma
                )
                vector = press.model_budgets(model.config, prompt.prompt_tokens)
                groups.setdefault(vector, []).append(index)
                presses.setdefault(vector, press)
            row = [math.nan] * len(grid.candidates)
            for vector, members in groups.items():
                presses[vector].post_init_from_model(model)
                value = kl_of(presses[vector])
                for index in members:
                    row[index] = value
            kl.append(row)
            caches += 1 + len(groups)
        return kl, snapkv, caches

    def select(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        calibration: CalibrationSet,
        profile: SensitivityProfile,
        config: ProfilingConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> SettingSelection:
        """The setting the rule chooses for ``profile`` on its own calibration prompts (``calibration``, checked
        against the profile's; ``config``: the profiling run's, for the prompts' ids), kept prefills released."""
        config = config or ProfilingConfig()
        recorded = profile.calibration.get("sha256")
        if recorded is not None and recorded != calibration.sha256():
            raise ValueError(
                "the setting is chosen on the profile's own calibration prompts, but this calibration set is another "
                f"(sha256 {calibration.sha256()[:12]}, the profile's {str(recorded)[:12]})"
            )
        started = time.perf_counter()
        enable_varlen_attention(model)
        profile.check_model(model)
        grid = self.grid
        per_prompt: list[tuple[int, list[list[float]], list[float], PrefilledPrompt]] = []
        reused = prefilled = caches = 0
        try:
            for index in range(len(calibration)):
                prompt = self._kept.pop(index, None)
                if prompt is None:
                    prompt = self._prefill_again(model, tokenizer, calibration, index, config)
                    prefilled += prompt is not None
                else:
                    reused += 1
                if prompt is not None:
                    kl, snapkv, count = self.score_prompt(model, prompt, profile)
                    caches += count
                    per_prompt.append((index, kl, snapkv, replace(prompt, cache=DynamicCache(), scores={})))
                del prompt
                if progress:
                    progress(index + 1, len(calibration))
        finally:
            self.release()
        if not per_prompt:
            raise ValueError(
                f"no calibration prompt is longer than the {grid.window_size}-token selection window: the setting "
                "cannot be chosen (ripplekv profile --no-select-setting keeps r 4, gamma 3)"
            )
        budgets = range(len(grid.budgets))
        candidates = tuple(
            SettingCandidate(ratio, gamma, tuple(tuple(kl[b][c] for _, kl, _, _ in per_prompt) for b in budgets))
            for c, (ratio, gamma) in enumerate(grid.candidates)
        )
        chosen = choose_setting(candidates)
        samples = calibration.samples
        prompts: dict[str, Any] = {
            "split": "all",
            "samples": [index for index, *_ in per_prompt],
            "sources": [samples[index].source for index, *_ in per_prompt],
            "context_tokens": [prompt.prompt_tokens for *_, prompt in per_prompt],
            "continuation_tokens": [len(prompt.continuation) for *_, prompt in per_prompt],
            "continuation": config.continuation,
            "calibration_sha256": calibration.sha256(),
        }
        setting = ProfileSetting(
            ratio=chosen.ratio,
            gamma=chosen.gamma,
            budgets=grid.budgets,
            candidates=candidates,
            snapkv_kl=tuple(tuple(snap[b] for _, _, snap, _ in per_prompt) for b in budgets),
            prompts=prompts,
            scorer="snapkv",
            window_size=grid.window_size,
        )
        return SettingSelection(setting, time.perf_counter() - started, reused, prefilled, caches)


def choose_profile_setting(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: CalibrationSet,
    profile: SensitivityProfile,
    config: ProfilingConfig | None = None,
    grid: SettingGrid | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SensitivityProfile:
    """``profile`` with the setting chosen on its own calibration prompts (prefilled once more each)."""
    selection = SettingSelector(grid).select(model, tokenizer, calibration, profile, config, progress)
    return replace(profile, setting=selection.setting)


@dataclass(frozen=True)
class ProfileRun:
    """A profile (its setting chosen unless skipped) and the seconds of its two parts: the sensitivity pass and the
    setting's selection (None when skipped)."""

    profile: SensitivityProfile
    sensitivity_seconds: float
    selection: SettingSelection | None


def profile_with_setting(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: CalibrationSet,
    config: ProfilingConfig | None = None,
    grid: SettingGrid | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    select: bool = True,
    memory: int | None = DEFAULT_SELECTION_MEMORY,
    selection_progress: Callable[[int, int], None] | None = None,
) -> ProfileRun:
    """``ripplekv profile`` in one process: the sensitivity pass (:func:`~ripplekv.profiling.sensitivity.
    profile_model`, its scores bit for bit the same) and, unless ``select`` is False, the setting's selection, which
    reuses the pass's prefills (up to ``memory`` bytes of caches)."""
    config = config or ProfilingConfig()
    selector = SettingSelector(grid, memory) if select else None
    started = time.perf_counter()
    profile = profile_model(model, tokenizer, calibration, config, checkpoint, progress, handoff=selector)
    seconds = time.perf_counter() - started
    if selector is None:
        return ProfileRun(profile, seconds, None)
    selection = selector.select(model, tokenizer, calibration, profile, config, selection_progress)
    return ProfileRun(replace(profile, setting=selection.setting), seconds, selection)
