"""The observation window a press needs at the end of the prompt, and the check that a prompt is longer."""

from __future__ import annotations

from kvpress.presses.base_press import BasePress


def selection_window(press: BasePress | None) -> int:
    """The observation window a press needs at the end of the prompt (0 if none), its wrapped press's included."""
    window = 0
    while press is not None:
        window = max(window, int(getattr(press, "window_size", 0) or 0))
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
