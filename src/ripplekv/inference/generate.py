"""Compress a prompt's KV cache with a press, then decode greedily over it (batch size 1)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.models.attention import attends_per_layer_natively, enable_varlen_attention, read_cache_masks
from ripplekv.models.cache import cache_bytes, fork_cache, layer_lengths
from ripplekv.models.chunked_prefill import check_prefill_chunk, chunk_bounds, prefill_in_chunks
from ripplekv.models.headwise import MASKED_KEYS, attention_modules, discard_masks, headwise_of, take_mask
from ripplekv.presses.selection_window import check_prompt_length

PROTOCOLS = ("question-aware", "query-agnostic")


@dataclass(frozen=True)
class Prefill:
    """A prompt prefilled (and compressed) into a cache; passes over it run on a fork and never change it."""

    cache: DynamicCache
    next_logits: torch.Tensor  # (vocab,): of the token after the prompt
    prompt_tokens: int  # the position of the next token
    seconds: float  # the prefill's wall time (plus any derivation or extension)


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
    """Run the unpadded prompt ``input_ids`` ``(1, n)`` into ``cache`` (written in place), compressing with ``press``.

    Head-wise masks kvpress's ``AdaKVPress`` leaves on the attention modules are moved into the cache's layers,
    where every later pass reads them. Without a press, prompts longer than ``prefill_chunk`` run in chunks; with
    one, they are an error (kvpress compresses a first pass only).
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
    start = time.perf_counter()
    if press is not None:
        modules = attention_modules(read_cache_masks(model))
        discard_masks(modules)
        try:
            with press(model):
                logits = model(input_ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        except BaseException:
            discard_masks(modules)
            raise
        cache.layers = [take_mask(module, layer) for module, layer in zip(modules, cache.layers, strict=True)]
    else:
        cache, logits = prefill_in_chunks(model, input_ids.to(device), prefill_chunk, cache)
    return Prefill(cache, logits[0, -1], input_ids.shape[1], time.perf_counter() - start)


@contextmanager
def _kvpress_masks(model: PreTrainedModel, cache: DynamicCache) -> Iterator[None]:
    """Under FlashAttention, the cache's head-wise masks set on the attention modules for one pass (for kvpress;
    exact on single-token decoding)."""
    masked = {index: mask for index, mask in enumerate(map(headwise_of, cache.layers)) if mask is not None}
    if not masked or not attends_per_layer_natively(model):
        yield
        return
    modules = attention_modules(model)
    held = [index for index in masked if getattr(modules[index], MASKED_KEYS, None) is not None]
    if held:
        raise ValueError(
            f"the attention modules of layer(s) {held} hold head-wise masks already (a kvpress press used directly, or "
            "a pass inside a pass): run a pass over a head-wise masked cache on its own"
        )
    try:
        for index, mask in masked.items():
            setattr(modules[index], MASKED_KEYS, mask.indices)
        yield
    finally:
        discard_masks(modules[index] for index in masked)


def cache_forward(
    model: PreTrainedModel, input_ids: torch.Tensor, cache: DynamicCache, positions: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    """The logits of ``input_ids`` ``(rows, n)`` over ``cache`` (extended in place) at ``positions`` ``(n,)``, every
    row alike; ``kwargs``: e.g. ``logits_to_keep``, ``key_validity``."""
    with _kvpress_masks(read_cache_masks(model), cache):
        return model(
            input_ids,
            past_key_values=cache,
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0).expand(input_ids.shape[0], -1),
            **kwargs,
        ).logits


@torch.no_grad()
def extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """Run more prompt tokens ``(1, n)`` over a fork of ``state.cache``, at their true positions."""
    _check_single(input_ids)
    device = next(model.parameters()).device
    positions = torch.arange(state.prompt_tokens, state.prompt_tokens + input_ids.shape[1], device=device)
    cache = fork_cache(state.cache)
    start = time.perf_counter()
    logits = cache_forward(model, input_ids.to(device), cache, positions, logits_to_keep=1)
    return Prefill(
        cache, logits[0, -1], state.prompt_tokens + input_ids.shape[1], state.seconds + time.perf_counter() - start
    )


def kept_tokens(state: Prefill) -> list[int]:
    """Tokens kept per layer of ``state.cache``, less ``round(masked entries / kv_heads)`` head-wise (AdaKV)."""
    kept = layer_lengths(state.cache)
    for index, layer in enumerate(state.cache.layers):
        mask = headwise_of(layer)
        if mask is not None:
            kept[index] -= round(mask.entries / mask.kv_heads)
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
    """Greedy tokens after a prefill, ending with the first id of ``stop_ids`` generated (included) if any; stop
    ids cannot be chosen before ``min_new_tokens``; ``fork`` makes the decoding cache (default ``fork_cache``)."""
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
    for _ in range(max_new_tokens):
        if len(tokens) < min_new_tokens and banned.numel():
            logits = logits.index_fill(-1, banned, float("-inf"))
        token = int(logits.argmax())
        tokens.append(token)
        if token in stop_ids or len(tokens) == max_new_tokens:
            break
        pos = torch.tensor([position], device=device)
        logits = cache_forward(model, torch.tensor([[token]], device=device), cache, pos)[0, -1]
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
    """The chat prompt for ``context`` + ``question`` (without a chat template, plain text ending in ``Answer:``),
    split where the question starts."""
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
    """Answer ``question`` about ``context`` with the cache compressed by ``press``: ``question-aware`` compresses
    the question with the context, ``query-agnostic`` runs it over the compressed context. Switches the model to
    variable-length attention."""
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
