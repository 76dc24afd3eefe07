"""The worker's check that the scheduler frees exactly the holes the worker reads around.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) frees a
block-aligned hole of each prompt on the scheduler side (:class:`~ripplekv_vllm.manager.RippleManager`), while the
worker compacts the prompt and reads around its own idea of that hole (:mod:`ripplekv_vllm.plan`). vLLM never tells
the worker which blocks the scheduler freed, so a disagreement (a kernel block size unlike the manager's, a changed
free timing) would let a request read blocks that another request has since been given, silently.

:class:`BlockLedger` closes that gap with the block ids vLLM does send: it records, per KV-cache group, which live
request reads each block, releases a request's hole (as the worker computes it) once the scheduler reports its
prompt computed, the step at which the manager frees it, and raises :class:`HoleMismatchError` when the scheduler
hands another request a block that a live request still reads. The check runs before the step's forward, so the
block is caught before it is overwritten. A manager that frees less than the worker's hole only costs capacity;
the engine tests pin the freed counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["BlockLedger", "HoleMismatchError"]

HoleOf = Callable[[int], tuple[int, int]]
"""``hole_of(num_prompt_tokens) -> (k, T)``: the token range ``[k, T)`` the worker reads around."""


class HoleMismatchError(RuntimeError):
    """The scheduler gave a request a block that another live request still reads: the two holes disagree."""


class BlockLedger:
    """Which live request reads each block of the RippleKV groups (see the module)."""

    def __init__(self, holes: Sequence[HoleOf | None], block_sizes: Sequence[int]) -> None:
        """An empty ledger.

        Args:
            holes: per KV-cache group, the worker's hole of a prompt length in tokens, or None for a group the
                plugin does not evict from (not tracked).
            block_sizes: per KV-cache group, the scheduler's block size (the block ids the scheduler sends).
        """
        if len(holes) != len(block_sizes):
            raise ValueError(f"{len(holes)} hole functions for {len(block_sizes)} KV-cache groups")
        self._holes = tuple(holes)
        self._block_sizes = tuple(int(b) for b in block_sizes)
        self._owner: dict[int, tuple[str, int]] = {}  # one block pool serves every group
        self._blocks: dict[str, list[list[int | None]]] = {}
        self._prompt: dict[str, int] = {}
        self._released: set[str] = set()

    def readers(self) -> dict[int, tuple[str, int]]:
        """A copy of ``{block id: (request, group)}`` of the blocks the live requests read."""
        return dict(self._owner)

    def update(self, scheduler_output: Any) -> None:
        """Apply one step's ``SchedulerOutput``, checking every block it hands out.

        Args:
            scheduler_output: the step's ``vllm.v1.core.sched.output.SchedulerOutput``.

        Raises:
            HoleMismatchError: a block given to a request is still read by another live request.
        """
        for request in scheduler_output.finished_req_ids:
            self._drop(request)
            self._prompt.pop(request, None)
        for request in scheduler_output.preempted_req_ids or ():
            self._drop(request)
        cached = scheduler_output.scheduled_cached_reqs
        for request, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if request in cached.resumed_req_ids:
                self._drop(request)
            elif computed >= self._prompt.get(request, computed + 1):
                self._release_hole(request)
        for new in scheduler_output.scheduled_new_reqs:
            tokens = new.prompt_token_ids if new.prompt_token_ids is not None else new.prompt_embeds
            self._drop(new.req_id)
            self._prompt[new.req_id] = len(tokens)
            self._claim(new.req_id, new.block_ids)
        for request, block_ids in zip(cached.req_ids, cached.new_block_ids):
            if block_ids is not None:
                self._claim(request, block_ids)

    def _claim(self, request: str, block_ids: Sequence[Iterable[int | None]]) -> None:
        rows = self._blocks.setdefault(request, [[] for _ in self._holes])
        for group, ids in enumerate(block_ids):
            if self._holes[group] is None:
                continue
            for block in ids:
                rows[group].append(block)
                if block is None or block == 0:  # the null block (vLLM's block 0) is shared by design
                    continue
                reader = self._owner.get(block)
                if reader is not None and reader[0] != request:
                    raise HoleMismatchError(self._message(group, block, request, *reader))
                self._owner[block] = (request, group)

    def _message(self, group: int, block: int, request: str, reader: str, reader_group: int) -> str:
        n = self._prompt[reader]
        hole_of = self._holes[reader_group]
        kept, full = hole_of(n) if hole_of is not None else (n, n)
        return (
            f"ripplekv: the scheduler gave block {block} to request {request} (KV-cache group {group}), but request "
            f"{reader} still reads it (group {reader_group}, whose hole the worker reads around is [{kept}, {full}) "
            f"of the {n}-token prompt, in blocks of {self._block_sizes[reader_group]} tokens): the scheduler's hole "
            "and the worker's disagree"
        )

    def _release_hole(self, request: str) -> None:
        if request in self._released or request not in self._blocks:
            return
        self._released.add(request)
        n = self._prompt[request]
        for group, hole_of in enumerate(self._holes):
            if hole_of is None:
                continue
            kept, full = hole_of(n)
            size = self._block_sizes[group]
            row = self._blocks[request][group]
            for index in range(-(-kept // size), min(full // size, len(row))):  # blocks wholly inside [k, T)
                block = row[index]
                if block is not None and self._owner.get(block) == (request, group):
                    del self._owner[block]

    def _drop(self, request: str) -> None:
        rows = self._blocks.pop(request, None)
        self._released.discard(request)
        if rows is None:
            return
        for group, row in enumerate(rows):
            for block in row:
                if block is not None and self._owner.get(block) == (request, group):
                    del self._owner[block]
