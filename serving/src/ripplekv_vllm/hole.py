"""Block-aligned eviction arithmetic of the RippleKV vLLM plugin: which prompt blocks a layer tier frees.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) gives each
layer its own KV-cache budget. In vLLM a layer tier's cache lives in paged blocks, and the CPU attention kernel
can only skip whole blocks, so a tier that keeps ``b`` of a prompt's ``N`` tokens keeps them as

* ``[0, k)``: the ``k`` highest-scored tokens of ``[0, T)``, compacted into the request's first ``k / bs`` blocks;
* ``[k, T)``: the *hole*, whole blocks handed back to vLLM's block pool after the prefill;
* ``[T, N)``: the prompt's last, partly filled block, left where it is (``T = N // bs * bs``).

The scheduler (which frees the hole) and the worker (which compacts ``[0, T)`` and reads around the hole) call
:func:`hole` with the same integers and must agree bit for bit, so this module is pure integer arithmetic with no
vLLM or torch import.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["check_hole_args", "hole", "min_kept_blocks", "realised_budget", "target_budget"]


def check_hole_args(num_prompt_tokens: int, keep_fraction: float, block_size: int, window: int) -> None:
    if isinstance(num_prompt_tokens, bool) or not isinstance(num_prompt_tokens, int) or num_prompt_tokens < 1:
        raise ValueError(f"num_prompt_tokens must be an integer >= 1, got {num_prompt_tokens!r}")
    if not (0.0 < keep_fraction <= 1.0):  # also rejects NaN
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")


def target_budget(num_prompt_tokens: int, keep_fraction: float, window: int) -> int:
    """The tokens a tier would keep without block alignment: ``int(keep_fraction * N)`` within ``[w, N]``.

    ``int(...)`` counts as kvpress counts kept tokens (``int(N * (1 - compression_ratio))``), and the budget never
    drops below the observation window ``w = min(window, N)``, which SnapKV always keeps.

    Args:
        num_prompt_tokens: the prompt length ``N`` (``>= 1``).
        keep_fraction: the tier's kept fraction of the prompt, in ``(0, 1]``.
        window: SnapKV's observation window (``>= 1``).
    """
    check_hole_args(num_prompt_tokens, keep_fraction, 1, window)
    return min(max(int(keep_fraction * num_prompt_tokens), min(window, num_prompt_tokens)), num_prompt_tokens)


def min_kept_blocks(num_prompt_tokens: int, block_size: int, window: int) -> int:
    """The fewest compacted blocks ``k / bs`` that keep the whole observation window.

    The window ``[N - w, N)`` must lie in ``[0, k)`` or in the tail ``[T, N)``, so ``k >= w - (N - T)``.

    Args:
        num_prompt_tokens: the prompt length ``N`` (``>= 1``).
        block_size: tokens per KV-cache block ``bs`` (``>= 1``).
        window: SnapKV's observation window (``>= 1``).
    """
    check_hole_args(num_prompt_tokens, 1.0, block_size, window)
    tail = num_prompt_tokens % block_size
    need = max(min(window, num_prompt_tokens) - tail, 0)
    return -(-need // block_size)


@lru_cache(maxsize=65536)
def hole(num_prompt_tokens: int, keep_fraction: float, block_size: int, window: int) -> tuple[int, int]:
    """``(k, T)``: the block-aligned token range ``[k, T)`` of the prompt a tier evicts after the prefill.

    ``T = N // bs * bs`` (the tail ``[T, N)`` stays in place) and ``k`` is the multiple of ``bs`` nearest to
    ``b - (N - T)`` for the target ``b`` of :func:`target_budget` (halves round up), raised to keep the window
    (:func:`min_kept_blocks`) and capped at ``T``. The realised budget ``k + (N - T)`` is therefore within
    ``bs / 2`` of ``b`` unless the window or the tail forces more; ``k == T`` means nothing is evicted (always the
    case for ``keep_fraction == 1``).

    Args:
        num_prompt_tokens: the prompt length ``N`` (``>= 1``).
        keep_fraction: the tier's kept fraction of the prompt, in ``(0, 1]``.
        block_size: tokens per KV-cache block ``bs`` (``>= 1``).
        window: SnapKV's observation window (``>= 1``).

    Raises:
        ValueError: on an argument out of range.
    """
    check_hole_args(num_prompt_tokens, keep_fraction, block_size, window)
    full = num_prompt_tokens // block_size * block_size
    tail = num_prompt_tokens - full
    budget = target_budget(num_prompt_tokens, keep_fraction, window)
    blocks = (budget - tail + block_size // 2) // block_size  # nearest multiple, halves up; floor division
    blocks = max(blocks, min_kept_blocks(num_prompt_tokens, block_size, window), 0)
    return min(blocks * block_size, full), full


def realised_budget(num_prompt_tokens: int, keep_fraction: float, block_size: int, window: int) -> int:
    """Tokens of the prompt a tier keeps after compaction: ``k + (N - T)`` for ``(k, T) = hole(...)``.

    Args:
        num_prompt_tokens: the prompt length ``N`` (``>= 1``).
        keep_fraction: the tier's kept fraction of the prompt, in ``(0, 1]``.
        block_size: tokens per KV-cache block ``bs`` (``>= 1``).
        window: SnapKV's observation window (``>= 1``).
    """
    kept, full = hole(num_prompt_tokens, keep_fraction, block_size, window)
    return kept + num_prompt_tokens - full
