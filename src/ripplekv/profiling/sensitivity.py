"""Offline sensitivity profiling (RippleKV paper, 2026, step 1).

Per calibration sample: prefill the context once and run the continuation over it, recording each layer's input;
then per layer ``l`` add norm-adaptive noise to layer ``l``'s cached Values only, rerun from layer ``l`` up
(:mod:`ripplekv.profiling.passes`) and take ``KL(P_ref || P_perturbed)`` averaged over continuation positions.
Seeded, and checkpointed per sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.models.cache import cache_from_tensors, cache_tensors, lean_fork
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, prefill_in_chunks
from ripplekv.models.identity import model_identity, weights_fingerprint
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.checkpoint import Checkpoint, SampleScores
from ripplekv.profiling.passes import (
    PRECISIONS,
    CleanPass,
    NoiseSpec,
    batched_by_depth,
    can_share_prefix,
    decoder_of,
    layer_by_layer,
    record_layer_calls,
)
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.validation import is_integer

DEFAULT_ALPHA = 0.5
# Bumped whenever a score's arithmetic changes, so a checkpoint of older scores is never resumed (3: float32 passes).
SCORING_VERSION = 3
DEFAULT_REPEATS = 1  # benchmarks/profile_stability.py: rho 0.983 across noise seeds, 0.995 vs 4 repeats
CONTINUATIONS = ("text", "model")
DEFAULT_ANSWER_TOKENS = 32


@dataclass(frozen=True)
class ProfilingConfig:
    """Parameters of sensitivity profiling.

    Attributes:
        alpha: relative noise scale (:func:`~ripplekv.profiling.noise.norm_adaptive_noise`).
        repeats: noise draws per (sample, layer), averaged; draws depend only on ``(seed, sample, layer)``.
        max_context_tokens: contexts keep their last tokens (None: the model's positions less the continuation).
        continuation: ``"text"`` (the sample's continuation, teacher-forced) or ``"model"`` (the model's own greedy
            answer to context + question, at most ``answer_tokens``).
        max_continuation_tokens: text continuations keep their first tokens (None: whole).
        prefill_chunk: longer contexts are prefilled in chunks (None: one pass).
    """

    alpha: float = DEFAULT_ALPHA
    repeats: int = DEFAULT_REPEATS
    seed: int = 0
    max_context_tokens: int | None = None
    continuation: str = "text"
    answer_tokens: int = DEFAULT_ANSWER_TOKENS
    max_continuation_tokens: int | None = None
    precision: str = "float32"
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and np.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        for name in ("repeats", "answer_tokens", "max_context_tokens", "max_continuation_tokens"):
            value, optional = getattr(self, name), name.startswith("max_")
            if not (optional and value is None) and (not is_integer(value) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1{' or None' if optional else ''}, got {value!r}")
        if self.continuation not in CONTINUATIONS:
            raise ValueError(f"continuation must be one of {CONTINUATIONS}, got {self.continuation!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        check_prefill_chunk(self.prefill_chunk)


class PrefillHandoff(Protocol):
    """Sees each calibration sample's full-cache prefill, so that another pass over the same prompts need not
    prefill them again: ``prefill`` computes as :func:`~ripplekv.models.chunked_prefill.prefill_in_chunks`; ``keep``
    gets the cache, the ``(vocab,)`` logits after the context and the scored ``(1, m)`` continuation."""

    def prefill(
        self, model: PreTrainedModel, context_ids: torch.Tensor, prefill_chunk: int | None
    ) -> tuple[DynamicCache, torch.Tensor]: ...

    def keep(
        self, sample_index: int, cache: DynamicCache, next_logits: torch.Tensor, continuation_ids: torch.Tensor
    ) -> None: ...


@torch.no_grad()
def score_sample(
    model: PreTrainedModel,
    context_ids: torch.Tensor,
    continuation_ids: torch.Tensor | None,
    config: ProfilingConfig,
    sample_index: int = 0,
    handoff: PrefillHandoff | None = None,
) -> SampleScores:
    """Per-layer KL and local scores of one sample, averaged over positions and draws, then clamped at 0:
    ``context_ids`` ``(1, n)`` prefilled, ``continuation_ids`` ``(1, m)`` (None: the model's own answer) scored;
    ``sample_index`` is part of the noise seed. ``handoff`` prefills and is handed the prefill when done."""
    given = continuation_ids is not None
    if context_ids.dim() != 2 or context_ids.shape[0] != 1 or (given and continuation_ids.dim() != 2):
        raise ValueError("score_sample takes one sample: ids of shape (1, n)")
    if (given and continuation_ids.shape[1] < 1) or context_ids.shape[1] < 1:
        raise ValueError("context and continuation must each hold at least one token")
    device = next(model.parameters()).device
    context_ids = context_ids.to(device)
    layers = list(decoder_of(model).layers)
    n_ctx = context_ids.shape[1]

    prefill, logits = (handoff.prefill if handoff else prefill_in_chunks)(model, context_ids, config.prefill_chunk)
    logits = logits[:, -1]
    clean = cache_tensors(prefill)
    if continuation_ids is None:  # decoded over a by-reference fork: the prefill is never copied
        continuation_ids = greedy_continuation(model, lean_fork(prefill), logits, n_ctx, config.answer_tokens)
    kept = prefill if handoff else None  # its tensors are ``clean``'s: holding them costs nothing more
    del prefill
    continuation_ids = continuation_ids.to(device)
    n_cont = continuation_ids.shape[1]
    positions = torch.arange(n_ctx, n_ctx + n_cont, device=device)

    # the reference itself is recomputed with the perturbed rows; the clean pass runs over a by-reference fork, so
    # its cache (kept by the recorded calls) holds the continuation's own tokens, not a copy of the prefill
    with record_layer_calls(layers) as calls:
        model(
            continuation_ids,
            past_key_values=lean_fork(cache_from_tensors(clean)),
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
            logits_to_keep=1,
        )
    clean_pass = CleanPass(clean, calls, n_cont)
    noise = NoiseSpec(float(config.alpha), config.repeats, config.seed, sample_index)
    run = batched_by_depth if can_share_prefix(model, n_ctx + n_cont) else layer_by_layer
    kl_scores, local_scores = run(model, clean_pass, noise, config.precision)
    if handoff is not None and kept is not None:
        handoff.keep(sample_index, kept, logits[0], continuation_ids)
    return SampleScores(tuple(kl_scores), tuple(local_scores), n_ctx, n_cont)


def _stop_ids(model: PreTrainedModel) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return set() if eos is None else {int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos])}


@torch.no_grad()
def greedy_continuation(
    model: PreTrainedModel, cache: DynamicCache, logits: torch.Tensor, position: int, max_tokens: int
) -> torch.Tensor:
    """``(1, m)``: the model's greedy answer after a prefill (``logits`` ``(1, vocab)``, ``position`` tokens in
    ``cache``, which it extends), ``1 <= m <= max_tokens``, stopping after an end-of-sequence token (included; never
    the first, as LongBench's ``min_length``)."""
    stops = _stop_ids(model)
    banned = sorted(i for i in stops if 0 <= i < logits.shape[-1])
    tokens: list[int] = []
    for step in range(max_tokens):
        scores = logits.float().clone()
        if step == 0 and banned:
            scores[:, banned] = float("-inf")
        token = int(scores.argmax(dim=-1))
        tokens.append(token)
        if token in stops or step == max_tokens - 1:
            break
        ids = torch.tensor([[token]], device=logits.device)
        at = torch.tensor([position + step], device=logits.device)
        out = model(ids, past_key_values=cache, use_cache=True, cache_position=at, position_ids=at.unsqueeze(0))
        logits = out.logits[:, -1]
    return torch.tensor([tokens], dtype=torch.long, device=logits.device)


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> torch.Tensor:
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def calibration_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sample: CalibrationSample, config: ProfilingConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``(1, n)`` context and ``(1, m)`` continuation ids (None for the model's own answer) of one sample."""
    own = config.continuation == "model"
    context_ids = _tokenize(tokenizer, sample.context + sample.question if own else sample.context)
    continuation_ids = None if own else _tokenize(tokenizer, sample.continuation)
    if continuation_ids is not None and config.max_continuation_tokens is not None:
        continuation_ids = continuation_ids[:, : config.max_continuation_tokens]
    length = config.answer_tokens if continuation_ids is None else continuation_ids.shape[1]
    limit = getattr(model.config, "max_position_embeddings", None)
    max_ctx = config.max_context_tokens
    room = max_ctx if max_ctx is not None else (limit - length if limit else None)
    if room is not None and context_ids.shape[1] > room:
        context_ids = context_ids[:, -room:]
    return context_ids, continuation_ids


def checkpoint_key(
    identity: dict[str, Any], fingerprint: str, calibration: CalibrationSet, config: ProfilingConfig
) -> dict[str, Any]:
    """What a checkpoint's samples must match to be reused (the first line of the checkpoint file)."""
    return {
        "model": identity["config_hash"],
        "weights": fingerprint,
        "scoring": SCORING_VERSION,
        "calibration": calibration.sha256(),
        "alpha": config.alpha,
        "repeats": config.repeats,
        "seed": config.seed,
        "max_context_tokens": config.max_context_tokens,
        **_continuation_settings(config),
        **({} if config.precision == "float32" else {"precision": config.precision}),
        # the model's own answers follow the prompts' questions, which the set's sha256 leaves out
        **({"questions": calibration.sha256(("question",))} if config.continuation == "model" else {}),
        **({} if config.prefill_chunk == DEFAULT_PREFILL_CHUNK else {"prefill_chunk": config.prefill_chunk}),
    }


def _continuation_settings(config: ProfilingConfig) -> dict[str, Any]:
    """The continuation settings that differ from whole text continuations (``{}`` for those)."""
    if config.continuation == "text":
        cap = config.max_continuation_tokens
        return {} if cap is None else {"max_continuation_tokens": cap}
    return {"continuation": config.continuation, "answer_tokens": config.answer_tokens}


def assemble_profile(
    identity: dict[str, Any],
    fingerprint: str,
    calibration: CalibrationSet,
    config: ProfilingConfig,
    done: Mapping[int, SampleScores],
) -> SensitivityProfile:
    """The profile of ``done`` (scores of every sample index), averaged in sample order."""
    from ripplekv.version import __version__

    total = len(calibration)
    missing = [i for i in range(total) if i not in done]
    if missing:
        raise ValueError(f"no scores for calibration sample(s) {missing[:10]} of {total}")
    ordered = [done[i] for i in range(total)]
    kl = np.array([s.kl for s in ordered], dtype=np.float64)
    local = np.array([s.local for s in ordered], dtype=np.float64)
    return SensitivityProfile(
        model=identity,
        scores=tuple(float(x) for x in kl.mean(0)),
        sample_scores=tuple(tuple(float(x) for x in row) for row in kl),
        local_scores=tuple(float(x) for x in local.mean(0)),
        alpha=float(config.alpha),
        repeats=config.repeats,
        seed=config.seed,
        calibration={
            "description": calibration.description,
            "sha256": calibration.sha256(),
            "samples": total,
            "context_tokens": [s.context_tokens for s in ordered],
            "continuation_tokens": [s.continuation_tokens for s in ordered],
            **_continuation_settings(config),
            **({} if config.prefill_chunk == DEFAULT_PREFILL_CHUNK else {"prefill_chunk": config.prefill_chunk}),
        },
        library_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        weights_fingerprint=fingerprint,
    )


def collect_profile(
    identity: dict[str, Any],
    fingerprint: str,
    calibration: CalibrationSet,
    config: ProfilingConfig,
    checkpoint: str | os.PathLike[str] | None,
    progress: Callable[[int, int], None] | None,
    run: Callable[[list[int], Callable[[int, SampleScores], None]], Any],
) -> SensitivityProfile:
    """The profile of the samples ``run(pending, on_item)`` scores (those ``checkpoint`` lacks), each checkpointed
    and reported as ``progress(done, total)`` as it arrives."""
    key = checkpoint_key(identity, fingerprint, calibration, config)
    ckpt = Checkpoint(Path(checkpoint), key) if checkpoint is not None else None
    done: dict[int, SampleScores] = dict(ckpt.done) if ckpt else {}
    total = len(calibration)

    def on_item(index: int, scores: SampleScores) -> None:
        done[int(index)] = scores
        if ckpt:
            ckpt.add(int(index), scores)
        if progress:
            progress(len(done), total)

    try:
        if progress:
            progress(len(done), total)
        run([i for i in range(total) if i not in done], on_item)
    finally:
        if ckpt:
            ckpt.close()  # its lock: one run writes a checkpoint at a time
    return assemble_profile(identity, fingerprint, calibration, config, done)


def profile_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: CalibrationSet,
    config: ProfilingConfig | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    handoff: PrefillHandoff | None = None,
) -> SensitivityProfile:
    """Measure the sensitivity profile of ``model`` (evaluation mode, any device and dtype) on ``calibration``.

    Args:
        checkpoint: JSON-lines file of finished samples, which a rerun of the same run skips; one of any other run
            is overwritten, with a warning.
        progress: called as ``progress(done, total)`` after each sample.
        handoff: prefills each sample scored here (not those taken from the checkpoint) and is handed its prefill.
    """
    config = config or ProfilingConfig()
    if len(calibration) == 0:
        raise ValueError("the calibration set is empty")

    def run(pending: list[int], on_item: Callable[[int, SampleScores], None]) -> None:
        for index in pending:
            ids = calibration_ids(model, tokenizer, calibration.samples[index], config)
            on_item(index, score_sample(model, *ids, config, sample_index=index, handoff=handoff))

    identity, fingerprint = model_identity(model), weights_fingerprint(model)
    return collect_profile(identity, fingerprint, calibration, config, checkpoint, progress, run)
