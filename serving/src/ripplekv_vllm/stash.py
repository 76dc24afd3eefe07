"""``PromptStash``: a chunk-prefilled prompt's keys, values and last queries, kept until its last piece compacts it.

SnapKV (RippleKV's selection) scores a prompt's keys with its last ``w`` queries, so a prompt is compacted in the
step that prefills its end. Under chunked prefill its earlier pieces were written to the paged cache in steps
before, in the CPU kernel's ISA-specific packed layout, which vLLM offers no operation to read back; the plugin keeps
each piece's post-RoPE keys and values (and the queries of the prompt's last ``w`` positions seen so far) aside per
request and layer as the piece is prefilled, and the compaction takes them. A prompt's pieces cost as much memory
again as its prompt's KV cache, outside vLLM's pool, until its last piece; a finished or preempted request's are
dropped (the runner reads them from each step's ``SchedulerOutput``), and a prompt prefilled again from its start
replaces what it had kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["PromptStash", "StashedPrompt"]


@dataclass
class StashedPrompt:
    """One request's prompt pieces at one layer: ``tokens`` prompt positions kept, in order.

    Attributes:
        keys: the pieces' post-RoPE keys, each ``[tokens, H, D]``.
        values: their values.
        queries: the queries of the last ``window`` positions kept, ``[<= window, HQ, D]``.
        tokens: the prompt positions kept (``[0, tokens)``).
    """

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    queries: torch.Tensor | None = None
    tokens: int = 0


class PromptStash:
    """The pieces of every prompt being prefilled in chunks, per request and layer (see the module)."""

    def __init__(self) -> None:
        self._prompts: dict[str, dict[str, StashedPrompt]] = {}

    def add(
        self,
        request: str,
        layer: str,
        computed: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        queries: torch.Tensor,
        window: int,
    ) -> None:
        """Keep a piece of ``request``'s prompt at ``layer`` that starts at prompt position ``computed``.

        Args:
            request: the request id.
            layer: the attention layer's name.
            computed: the piece's first prompt position (0: the prompt starts again, what was kept is replaced).
            keys: the piece's post-RoPE keys, ``[tokens, H, D]`` (copied).
            values: its values.
            queries: its post-RoPE queries, ``[tokens, HQ, D]`` (the last ``window`` kept with the earlier ones').
            window: the SnapKV observation window.

        Raises:
            RuntimeError: the piece does not follow what was kept (a prompt's pieces must arrive in order).
        """
        layers = self._prompts.setdefault(request, {})
        if computed == 0:
            layers[layer] = StashedPrompt()
        kept = layers.get(layer)
        if kept is None or kept.tokens != computed:
            raise RuntimeError(
                f"ripplekv: request {request} prefills prompt positions from {computed} at layer {layer}, but "
                f"{0 if kept is None else kept.tokens} are kept: a chunked prompt's pieces must arrive in order"
            )
        kept.keys.append(keys.clone())
        kept.values.append(values.clone())
        recent = queries[-window:] if kept.queries is None else torch.cat([kept.queries, queries[-window:]])
        kept.queries = recent[-window:].clone()
        kept.tokens += int(keys.shape[0])

    def take(self, request: str, layer: str, computed: int) -> StashedPrompt:
        """Remove and return what ``request`` kept at ``layer``, which must be its first ``computed`` positions.

        Raises:
            RuntimeError: what was kept is not the prompt's first ``computed`` positions.
        """
        layers = self._prompts.get(request, {})
        kept = layers.pop(layer, None)
        if not layers:
            self._prompts.pop(request, None)
        if kept is None or kept.tokens != computed:
            raise RuntimeError(
                f"ripplekv: request {request} completes its prompt at layer {layer} after {computed} positions "
                f"prefilled before, but {0 if kept is None else kept.tokens} are kept"
            )
        return kept

    def drop(self, requests: Iterable[str]) -> None:
        """Forget what ``requests`` kept (finished or preempted)."""
        for request in requests:
            self._prompts.pop(request, None)

    @property
    def requests(self) -> frozenset[str]:
        """The requests with pieces kept."""
        return frozenset(self._prompts)

    @property
    def nbytes(self) -> int:
        """Bytes of every kept key, value and query."""
        return sum(
            sum(t.nbytes for t in (*kept.keys, *kept.values)) + (0 if kept.queries is None else kept.queries.nbytes)
            for layers in self._prompts.values()
            for kept in layers.values()
        )
