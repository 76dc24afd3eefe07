"""Compress a prompt's KV cache with a press, then decode greedily over it (batch size 1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.inference.module_state import ABSENT, ModuleState, applied_state, attention_modules, capture_state
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_bytes, fork_cache, layer_lengths
from ripplekv.models.chunked_prefill import check_prefill_chunk, chunk_bounds, prefill_in_chunks
from ripplekv.presses.registry import check_prompt_length

PROTOCOLS = ("question-aware", "query-agnostic")


@dataclass(frozen=True)
class Prefill:
    """A prompt prefilled (and compressed) into a cache.

    Args:
        cache: the (compressed) cache of the prompt. :func:`extend`, :func:`greedy_decode` and
            :func:`ripplekv_eval.fastpath.fidelity.teacher_forced_logprobs` run over a fork of it and never change it.
        next_logits: ``(vocab,)`` logits of the token after the prompt.
        prompt_tokens: tokens of the prompt, i.e. the position of the next token.
        seconds: wall time of the prefill (plus any derivation or extension).
        attention_state: attention-module attributes the press set for later passes (AdaKV's
            ``masked_key_indices``), applied during every pass over this cache and removed afterwards
            (see :mod:`ripplekv.inference.module_state`); empty for presses that act through the cache alone.
    """

    cache: DynamicCache
    next_logits: torch.Tensor
    prompt_tokens: int
    seconds: float
    attention_state: tuple[ModuleState, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_state", tuple(self.attention_state))
        if not all(isinstance(state, ModuleState) for state in self.attention_state):
            raise TypeError("attention_state must hold ModuleState entries")


@dataclass(frozen=True)
class GenerationResult:
    """An answer and what its cache cost."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    layer_tokens: tuple[int, ...]  # tokens kept per layer after compression (AdaKV: masked keys not counted)
    kv_bytes: int  # bytes of the compressed cache (the part that was compressed)
    full_kv_bytes: int  # bytes the same part takes uncompressed
    prefill_seconds: float
    decode_seconds: float

    @property
    def kv_fraction(self) -> float:
        return self.kv_bytes / self.full_kv_bytes if self.full_kv_bytes else 1.0


def _check_single(input_ids: torch.Tensor) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"expected one unpadded sequence of shape (1, n), got {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 1:
        raise ValueError("the prompt is empty")


@torch.no_grad()
def prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    press: BasePress | None = None,
    cache: DynamicCache | None = None,
    prefill_chunk: int | None = None,
) -> Prefill:
    """Run ``input_ids`` (shape ``(1, n)``) into ``cache`` (a new one by default), compressing with ``press``.

    Attributes the press sets on the attention modules (AdaKV's ``masked_key_indices``) are captured into the
    result's ``attention_state`` and the modules are restored: later passes over the result apply them.

    Args:
        model: the model.
        input_ids: the prompt, one unpadded sequence.
        press: a kvpress press compressing the cache during the pass (None: no compression).
        cache: the cache to fill (written in place); a new ``DynamicCache`` by default. To run tokens after a
            (compressed) context at their true positions use :func:`extend` instead.
        prefill_chunk: without a press, a prompt longer than this is run in chunks of at most ``prefill_chunk``
            tokens over the growing cache (:func:`~ripplekv.models.chunked_prefill.prefill_in_chunks`: activations
            of one chunk; the cache equal to a one-pass prefill's up to float rounding). None (default): one pass.
            A press compresses each layer inside its one pass (kvpress's hook compresses a first pass only), so
            with a press a prompt longer than the chunk raises ValueError: record it in chunks and derive the
            press's cache instead (:func:`ripplekv_eval.fastpath.derive.compressed_prefill_in_chunks`).
    """
    _check_single(input_ids)
    chunks = chunk_bounds(int(input_ids.shape[1]), check_prefill_chunk(prefill_chunk))
    if press is not None and len(chunks) > 1:
        raise ValueError(
            f"prefill_chunk={prefill_chunk} would cut the {input_ids.shape[1]}-token prompt into {len(chunks)} passes, "
            f"but {type(press).__name__} compresses within one pass: prefill it in one pass (prefill_chunk=None), or "
            "derive its cache from a chunked record (ripplekv_eval.fastpath.derive.compressed_prefill_in_chunks)"
        )
    check_prompt_length(press, input_ids.shape[1])
    cache = cache if cache is not None else (DynamicCache() if len(chunks) == 1 else None)
    device = next(model.parameters()).device
    captured: list[ModuleState] = []
    start = time.perf_counter()
    if press is not None:
        with capture_state(attention_modules(model), captured), press(model):
            logits = model(input_ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    else:
        cache, logits = prefill_in_chunks(model, input_ids.to(device), prefill_chunk, cache)
    return Prefill(cache, logits[0, -1], input_ids.shape[1], time.perf_counter() - start, tuple(captured))


@torch.no_grad()
def extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """Run more prompt tokens over a (possibly compressed) cache, at their true positions.

    The pass runs over a fork of ``state.cache`` (``state`` is left unchanged) with ``state.attention_state``
    applied; the result holds the fork and the same attention state.

    Args:
        model: the model ``state`` was prefilled with.
        state: the prefilled (compressed) prompt.
        input_ids: the new tokens, shape ``(1, n)``.
    """
    _check_single(input_ids)
    device = next(model.parameters()).device
    positions = torch.arange(state.prompt_tokens, state.prompt_tokens + input_ids.shape[1], device=device)
    cache = fork_cache(state.cache)
    start = time.perf_counter()
    with applied_state(model, state.attention_state):
        logits = model(
            input_ids.to(device),
            past_key_values=cache,
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
            logits_to_keep=1,
        ).logits
    return Prefill(
        cache,
        logits[0, -1],
        state.prompt_tokens + input_ids.shape[1],
        state.seconds + time.perf_counter() - start,
        state.attention_state,
    )


def kept_tokens(state: Prefill) -> list[int]:
    """Tokens kept per layer of ``state.cache``; keys masked head-wise (AdaKV) are not counted.

    A layer whose attention state holds ``masked_key_indices`` (kvpress's ``(batch, head, position)`` index
    tensors) counts ``round(masked entries / kv_heads)`` tokens fewer than it holds.

    Args:
        state: a prefilled (compressed) prompt.
    """
    kept = layer_lengths(state.cache)
    for module_state in state.attention_state:
        masked = module_state.attributes.get("masked_key_indices")
        if masked is None or masked is ABSENT:
            continue
        if module_state.layer >= len(kept):
            raise ValueError(f"attention state for layer {module_state.layer}, but the cache has {len(kept)} layers")
        kv_heads = state.cache.layers[module_state.layer].keys.shape[1]
        kept[module_state.layer] -= round(len(masked[0]) / kv_heads)
    return kept


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> set[int]:
    ids = model.generation_config.eos_token_id
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        found.add(int(tokenizer.eos_token_id))
    return found


@torch.no_grad()
def greedy_decode(
    model: PreTrainedModel,
    state: Prefill,
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int = 0,
    fork: Callable[[DynamicCache], DynamicCache] | None = None,
) -> list[int]:
    """Greedy tokens after a prefill, ending with the first id of ``stop_ids`` generated (included) if any.

    Decodes over a fork of ``state.cache`` with ``state.attention_state`` applied, so one :class:`Prefill` can be
    decoded several times.

    Args:
        model: the model ``state`` was prefilled with.
        state: the prefilled (compressed) prompt.
        max_new_tokens: most tokens to generate (>= 1).
        stop_ids: token ids that end the answer.
        min_new_tokens: for the first ``min_new_tokens`` tokens the stop ids cannot be chosen (their logits are
            set to -inf before the argmax), as transformers' ``MinNewTokensLengthLogitsProcessor`` and
            LongBench's ``pred.py`` (``min_length``) do.
        fork: how the decoding cache is made from ``state.cache``, which is left unchanged (default
            :func:`~ripplekv.models.cache.fork_cache`; the shared prefill passes its by-reference fork).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
        raise ValueError(f"min_new_tokens must be an int >= 0, got {min_new_tokens!r}")
    device = state.next_logits.device
    vocab = state.next_logits.shape[-1]
    banned = torch.tensor(sorted(i for i in stop_ids if 0 <= i < vocab), dtype=torch.long, device=device)
    cache = (fork or fork_cache)(state.cache)
    tokens: list[int] = []
    logits = state.next_logits
    position = state.prompt_tokens
    with applied_state(model, state.attention_state):
        for _ in range(max_new_tokens):
            if len(tokens) < min_new_tokens and banned.numel():
                logits = logits.index_fill(-1, banned, float("-inf"))
            token = int(logits.argmax())
            tokens.append(token)
            if token in stop_ids or len(tokens) == max_new_tokens:
                break
            pos = torch.tensor([position], device=device)
            logits = model(
                torch.tensor([[token]], device=device),
                past_key_values=cache,
                use_cache=True,
                cache_position=pos,
                position_ids=pos.unsqueeze(0),
            ).logits[0, -1]
            position += 1
    return tokens


def full_cache_bytes(model: PreTrainedModel, tokens: int) -> int:
    """Bytes of an uncompressed KV cache of ``tokens`` tokens."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * element


def chat_prompt_parts(tokenizer: PreTrainedTokenizerBase, context: str, question: str) -> tuple[str, str]:
    """The chat prompt for ``context`` + ``question``, split where the question starts.

    Without a chat template the prompt is the plain text ``context\\n\\nquestion\\nAnswer:``.
    """
    marker = "\n\n"
    if getattr(tokenizer, "chat_template", None):
        user = context + marker + question
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        split = text.index(user) + len(context)
        return text[:split], text[split:]
    return context, marker + question + "\nAnswer:"


def generate_answer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    context: str,
    question: str,
    press: BasePress | None = None,
    max_new_tokens: int = 32,
    protocol: str = "question-aware",
) -> GenerationResult:
    """Answer ``question`` about ``context`` with the cache compressed by ``press``.

    Protocols:
        ``question-aware`` (default; the paper's and KVCache-Factory's): the whole prompt, question
        included, is prefilled and compressed, so SnapKV's observation window holds the question.
        ``query-agnostic`` (kvpress's): only the context is compressed; the question is then run over the
        compressed cache as a multi-token pass.

    Stock ``sdpa`` and ``eager`` are switched to their variable-length variants
    (:func:`ripplekv.models.attention.enable_varlen_attention`, idempotent; identical results on ordinary
    caches), which multi-token passes over per-layer compressed caches need; FlashAttention is kept as loaded (it
    attends over such caches natively).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    enable_varlen_attention(model)
    head, tail = chat_prompt_parts(tokenizer, context, question)
    encode = lambda text: tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # noqa: E731
    if protocol == "question-aware":
        state = prefill(model, torch.cat([encode(head), encode(tail)], dim=1), press)
    else:
        state = prefill(model, encode(head), press)
    compressed, kv, compressed_prompt = kept_tokens(state), cache_bytes(state.cache), state.prompt_tokens
    if protocol == "query-agnostic":
        state = extend(model, state, encode(tail))
    start = time.perf_counter()
    tokens = greedy_decode(model, state, max_new_tokens, eos_ids(model, tokenizer))
    decode_seconds = time.perf_counter() - start
    return GenerationResult(
        text=tokenizer.decode(tokens, skip_special_tokens=True).strip(),
        token_ids=tuple(tokens),
        prompt_tokens=state.prompt_tokens,
        layer_tokens=tuple(compressed),
        kv_bytes=kv,
        full_kv_bytes=full_cache_bytes(model, compressed_prompt),
        prefill_seconds=state.seconds,
        decode_seconds=decode_seconds,
    )
