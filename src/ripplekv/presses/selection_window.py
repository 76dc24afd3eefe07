"""The checks a prompt passes before a press compresses it: longer than the observation window the press needs at
its end, and (at each layer's prefill) not padded."""

from __future__ import annotations

import torch
from kvpress.presses.base_press import BasePress

from ripplekv.models.attention_masks import PaddedBatchError
from ripplekv.validation import is_integer


def scorer_window(press: object) -> int:
    """A press's own observation window, its ``window_size`` (SnapKV's: the scorer keeps it in every layer whatever
    its scores), 0 for a press without one."""
    return int(getattr(press, "window_size", 0) or 0)


def resolve_floor(floor: object, window_size: int) -> int:
    """The smallest budget a press gives a layer: ``floor`` (an integer ``>= 1``: a layer with no token breaks the
    cache), or for None the scorer's ``window_size`` (SnapKV always keeps its window), else 1."""
    if floor is None:
        return max(1, int(window_size))
    if not is_integer(floor) or floor < 1:  # type: ignore[operator]
        raise ValueError(f"floor must be an integer >= 1 (a layer needs a token), got {floor!r}")
    return int(floor)  # type: ignore[call-overload]


def selection_window(press: BasePress | None) -> int:
    """The observation window a press needs at the end of the prompt (0 if none), its wrapped press's included."""
    window = 0
    while press is not None:
        window = max(window, scorer_window(press))
        press = getattr(press, "press", None)
    return window


def check_prompt_length(press: BasePress | None, prompt_tokens: int) -> None:
    """Raise ``ValueError`` if the prompt is not longer than the press's selection window."""
    window = selection_window(press)
    if window and prompt_tokens <= window:
        raise ValueError(
            f"the prompt has {prompt_tokens} tokens, not more than the {window}-token selection window of "
            f"{type(press).__name__}: use a longer prompt or a smaller window_size"
        )


def has_padding(attention_mask: torch.Tensor | None) -> bool:
    """Whether a prefill's 4D attention mask hides some token from the last query (i.e. padding)."""
    if attention_mask is None:
        return False
    last = attention_mask[..., -1, :]
    visible = last if last.dtype == torch.bool else last == 0
    return not bool(visible.all())


def check_compressible(press: object, kwargs: dict, k_len: int, window: int) -> None:
    """Raise unless a layer's prefill can be compressed: no padding (checked even where a layer keeps every token:
    the mask fitted over the compressed layers would attend to it), more tokens than the selection window."""
    if has_padding(kwargs.get("attention_mask")):
        raise PaddedBatchError(
            f"{type(press).__name__} cannot compress a padded batch: use batch size 1 or equal lengths"
        )
    if k_len <= window:
        raise ValueError(f"the prompt has {k_len} tokens, not more than the {window}-token selection window")
