"""How many prompt tokens each layer of the RippleKV vLLM plugin keeps, from the prompt length alone.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) gives each layer
its own share of a global KV budget. vLLM frees memory per block, so the plugin keeps each layer's budget in whole
blocks, computed for each prompt from its own length ``N``, for *budget groups* of layers (by default one per layer;
all layers are served from one KV-cache group either way, :mod:`ripplekv_vllm.pool`):

* :class:`ProfileBudgets`: the library's RippleKV budgets at ``N``
  (:class:`ripplekv.allocation.ProfileSchedule`, SnapKV's window as the floor, exactly what ``LayerBudgetPress``
  keeps), each group's target its layers' mean, apportioned in whole blocks so that every prompt keeps exactly the
  blocks SnapKV-uniform keeps at the same budget (largest remainder; ties to the more sensitive group);
* :class:`FractionBudgets`: one fixed kept fraction per group (SnapKV-uniform is one group at the budget).

The scheduler (which frees the hole of the request's block ids, :meth:`GroupBudgets.pooled_hole`) and the worker
(which compacts each layer and reads around it) ask with the same integers and get the same answer; nothing here
imports vLLM or kvpress.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from ripplekv.allocation.budget import ProfileSchedule

from ripplekv_vllm.hole import check_hole_args, hole, min_kept_blocks

__all__ = ["FractionBudgets", "GroupBudgets", "ProfileBudgets", "layer_groups", "tier_groups"]


class GroupBudgets(ABC):
    """Per budget group of layers, the prompt tokens kept: ``hole(N, group) = (k, T)``, the evicted range ``[k, T)``.

    The scheduler and the worker ask for every request's hole at every step, so each prompt length's answer is
    computed once and kept in the instance (a per-length memo: hashing the object per call would cost more).
    """

    groups: tuple[tuple[int, ...], ...]
    block_size: int
    window: int
    _memo: dict[int, tuple[int, ...]]
    _layer_memo: dict[int, tuple[int, ...]]

    def kept_blocks(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """``k / bs`` of every group for a prompt of ``num_prompt_tokens`` tokens (``k`` of ``[0, T)`` kept)."""
        found = self._memo.get(num_prompt_tokens)
        if found is None:
            found = self._memo[num_prompt_tokens] = self._compute(num_prompt_tokens)
        return found

    @abstractmethod
    def _compute(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """:meth:`kept_blocks`, computed."""

    def hole(self, num_prompt_tokens: int, group: int) -> tuple[int, int]:
        """``(k, T)``: the block-aligned prompt range group ``group`` evicts (``k == T``: none).

        Args:
            num_prompt_tokens: the prompt length ``N`` (``>= 1``).
            group: the group's index in :attr:`groups`.
        """
        full = num_prompt_tokens // self.block_size * self.block_size
        return self.kept_blocks(num_prompt_tokens)[group] * self.block_size, full

    def layer_kept_blocks(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """``k / bs`` of every layer (its group's) for a prompt of ``num_prompt_tokens`` tokens."""
        found = self._layer_memo.get(num_prompt_tokens)
        if found is None:
            per_group = self.kept_blocks(num_prompt_tokens)
            out = [0] * sum(len(members) for members in self.groups)
            for blocks, members in zip(per_group, self.groups):
                for layer in members:
                    out[layer] = blocks
            found = self._layer_memo[num_prompt_tokens] = tuple(out)
        return found

    def pooled_hole(self, num_prompt_tokens: int) -> tuple[int, int]:
        """``(k, T)`` of the one KV-cache group that holds every layer (:mod:`ripplekv_vllm.pool`).

        A request keeps ``k / bs`` of its prompt's block ids, each one page of every layer: enough pages for every
        layer's kept blocks (``k / bs = ceil(sum / L)``; exactly SnapKV-uniform's count for :class:`ProfileBudgets`,
        whose layers' blocks sum to ``L`` times it).

        Args:
            num_prompt_tokens: the prompt length ``N`` (``>= 1``).
        """
        layers = self.layer_kept_blocks(num_prompt_tokens)
        full = num_prompt_tokens // self.block_size * self.block_size
        return -(-sum(layers) // len(layers)) * self.block_size, full

    def layer_budgets(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """Tokens of the prompt each layer keeps: its group's ``k`` plus the tail ``[T, N)`` kept in place."""
        tail = num_prompt_tokens % self.block_size
        out = [0] * sum(len(members) for members in self.groups)
        for blocks, members in zip(self.kept_blocks(num_prompt_tokens), self.groups):
            for layer in members:
                out[layer] = blocks * self.block_size + tail
        return tuple(out)

    def _check_groups(self, num_layers: int | None = None) -> None:
        layers = sorted(layer for members in self.groups for layer in members)
        if not self.groups or layers != list(range(len(layers))):
            raise ValueError(f"groups must partition the layers 0..L-1, got {self.groups!r}")
        if num_layers is not None and len(layers) != num_layers:
            raise ValueError(f"groups cover {len(layers)} layers, the model has {num_layers}")
        check_hole_args(1, 1.0, self.block_size, self.window)


def layer_groups(num_layers: int) -> tuple[tuple[int, ...], ...]:
    """One group per layer: the library's per-layer budgets, block-rounded."""
    return tuple((layer,) for layer in range(num_layers))


def tier_groups(order: Sequence[int], tiers: int) -> tuple[tuple[int, ...], ...]:
    """``tiers`` groups of equal size, each a run of ``order`` (layers ranked by their budget).

    Args:
        order: every layer index, ranked.
        tiers: the number of groups (``>= 1``, dividing the layer count).
    """
    n = len(order)
    if isinstance(tiers, bool) or not isinstance(tiers, int) or tiers < 1 or n % tiers:
        raise ValueError(f"tiers must be an integer >= 1 dividing the {n} layers (equal group sizes), got {tiers!r}")
    size = n // tiers
    return tuple(tuple(sorted(order[start : start + size])) for start in range(0, n, size))


@dataclass(frozen=True)
class FractionBudgets(GroupBudgets):
    """One kept fraction per group: group ``g`` keeps :func:`ripplekv_vllm.hole.hole` of ``fractions[g]``.

    Attributes:
        groups: the layers of each group.
        fractions: each group's kept fraction of the prompt, in ``(0, 1]``.
        block_size: tokens per KV-cache block.
        window: SnapKV's observation window (always kept).
    """

    groups: tuple[tuple[int, ...], ...]
    fractions: tuple[float, ...]
    block_size: int
    window: int
    _memo: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _layer_memo: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_groups()
        if len(self.fractions) != len(self.groups):
            raise ValueError(f"{len(self.fractions)} fractions for {len(self.groups)} groups")
        for fraction in self.fractions:
            check_hole_args(1, fraction, self.block_size, self.window)

    @classmethod
    def of_layers(cls, fractions: Sequence[float], block_size: int, window: int) -> FractionBudgets:
        """Groups of the layers that share a fraction (in order of first appearance)."""
        members: dict[float, list[int]] = {}
        for layer, fraction in enumerate(fractions):
            members.setdefault(float(fraction), []).append(layer)
        return cls(tuple(tuple(m) for m in members.values()), tuple(members), block_size, window)

    def _compute(self, num_prompt_tokens: int) -> tuple[int, ...]:
        bs, window = self.block_size, self.window
        return tuple(hole(num_prompt_tokens, f, bs, window)[0] // bs for f in self.fractions)


@dataclass(frozen=True)
class ProfileBudgets(GroupBudgets):
    """The library's RippleKV budgets at each prompt's own length, served by groups in whole blocks.

    For a prompt of ``N`` tokens (``T = N // bs * bs``): the library's per-layer budgets ``b_l`` (what
    ``LayerBudgetPress`` with this schedule and SnapKV's window keeps), each group's target ``mean(b_l) - (N - T)``
    in blocks, apportioned by largest remainder (ties: the group of the higher mean score, then the lower index)
    over SnapKV-uniform's blocks at the same budget (``G * k_u`` for ``k_u`` = :func:`hole` of the budget), each
    group within ``[min_kept_blocks, T / bs]``. So every prompt keeps the same number of blocks as under
    SnapKV-uniform, and each layer keeps its library budget up to the block rounding.

    Attributes:
        groups: the layers of each group.
        scores: the profile's per-layer sensitivity.
        budget: the global kept fraction, in ``(0, 1]``.
        ratio: the allocation's disparity ``r``.
        gamma: the allocation's clip bound.
        block_size: tokens per KV-cache block.
        window: SnapKV's observation window (the library's per-layer floor, always kept).
    """

    groups: tuple[tuple[int, ...], ...]
    scores: tuple[float, ...]
    budget: float
    ratio: float
    gamma: float
    block_size: int
    window: int
    schedule: ProfileSchedule = field(init=False, repr=False, compare=False)
    _memo: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _layer_memo: dict[int, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_groups(len(self.scores))
        object.__setattr__(self, "schedule", ProfileSchedule(self.budget, self.scores, self.ratio, self.gamma))

    @cached_property
    def _preference(self) -> np.ndarray:
        sign = 1.0 if self.ratio >= 1 else -1.0
        return np.array([sign * float(np.mean([self.scores[i] for i in m])) for m in self.groups])

    def library_budgets(self, num_prompt_tokens: int) -> tuple[int, ...]:
        """The library's per-layer budgets of the prompt (no block rounding)."""
        return self.schedule.layer_budgets(len(self.scores), int(num_prompt_tokens), self.window)

    def _compute(self, num_prompt_tokens: int) -> tuple[int, ...]:
        bs = self.block_size
        full_blocks, tail = divmod(num_prompt_tokens, bs)
        low = min(min_kept_blocks(num_prompt_tokens, bs, self.window), full_blocks)
        uniform = hole(num_prompt_tokens, self.budget, bs, self.window)[0] // bs
        library = np.asarray(self.library_budgets(num_prompt_tokens), dtype=np.float64)
        targets = np.array([(library[list(m)].mean() - tail) / bs for m in self.groups])
        return apportion(targets, uniform * len(self.groups), low, full_blocks, self._preference)


def apportion(targets: np.ndarray, total: int, low: int, high: int, preference: np.ndarray) -> tuple[int, ...]:
    """Integers within ``[low, high]`` summing to ``total``, nearest to ``targets`` by largest remainder.

    Each starts at ``clip(floor(target))``; the missing units go to the largest remainders (the surplus leaves the
    smallest), ties to the higher ``preference``, then the lower index.

    Args:
        targets: real targets, one per group.
        total: the sum to reach, within ``[len * low, len * high]``.
        low: the least any group keeps.
        high: the most any group keeps.
        preference: the tie-breaker, one per group.
    """
    n = len(targets)
    if not n * low <= total <= n * high:
        raise ValueError(f"cannot apportion {total} over {n} groups within [{low}, {high}]")
    floors = np.floor(targets)
    out = np.clip(floors, low, high).astype(np.int64)
    remainder = targets - floors
    missing = total - int(out.sum())
    # largest remainder first when adding, smallest first when removing; stable ties by preference, then index
    order = (
        np.lexsort((np.arange(n), -preference, -remainder))
        if missing > 0
        else np.lexsort((np.arange(n), preference, remainder))
    )
    step = 1 if missing > 0 else -1
    while missing:
        moved = False
        for g in order:
            if missing and low <= out[g] + step <= high:
                out[g] += step
                missing -= step
                moved = True
        if not moved:  # unreachable given the bounds check
            raise ValueError(f"cannot apportion {total} within [{low}, {high}]")
    if not math.isfinite(float(targets.sum())):
        raise ValueError(f"non-finite targets {targets.tolist()}")
    return tuple(int(v) for v in out)
