"""``RippleSpec``: a full-attention KV-cache spec that carries its RippleKV tier (Xu et al., 2026).

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps a
different share of the prompt in each layer. vLLM groups layers into KV-cache groups by their spec, and one
manager serves each group, so a group of the plugin is a spec: a :class:`FullAttentionSpec` with the plugin's
:class:`~ripplekv_vllm.budgets.GroupBudgets` (how many prompt blocks each group keeps, from the prompt length), the
group's index in it, and the SnapKV scorer settings (``window``, ``kernel_size``).

Two overrides keep groups apart (vLLM 0.32.0's ``get_kv_cache_groups``): :meth:`RippleSpec.merge` raises
``AssertionError`` (the exception vLLM catches to tell groups apart) for specs of different groups, where the
inherited merge would silently drop the group fields, and :meth:`RippleSpec.is_uniform_with_collection` compares
the group fields, where the inherited check would put every ``RippleSpec`` into one uniform group. The spec is
registered with itself as its uniform base (``ripplekv_vllm.register``), not under ``FullAttentionSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec

from ripplekv_vllm.budgets import GroupBudgets

__all__ = ["RippleSpec", "ripple_spec_from"]


def _base_fields(spec: FullAttentionSpec) -> dict[str, Any]:
    """The constructor arguments of ``spec`` as a plain :class:`FullAttentionSpec`."""
    return {f.name: getattr(spec, f.name) for f in fields(FullAttentionSpec) if f.init}


@dataclass(frozen=True, kw_only=True)
class RippleSpec(FullAttentionSpec):
    """A full-attention layer of one RippleKV group.

    Attributes:
        budgets: every group's kept prompt blocks, from the prompt length (None: nothing is evicted).
        group: this layer's group in ``budgets``.
        window: SnapKV's observation window, always kept.
        kernel_size: SnapKV's pooling kernel.
    """

    budgets: GroupBudgets | None = None
    group: int = 0
    window: int = 64
    kernel_size: int = 5

    @property
    def tier(self) -> tuple[GroupBudgets | None, int, int, int]:
        """The fields that tell groups apart."""
        return (self.budgets, self.group, self.window, self.kernel_size)

    def hole(self, num_prompt_tokens: int) -> tuple[int, int]:
        """``(k, T)``: the prompt range ``[k, T)`` this group evicts (``k == T``: none).

        Args:
            num_prompt_tokens: the prompt length ``N``.
        """
        full = num_prompt_tokens // self.block_size * self.block_size
        if self.budgets is None:
            return full, full
        return self.budgets.hole(num_prompt_tokens, self.group)

    @property
    def prefix_cacheable(self) -> bool:
        """Never: the prompt's blocks are compacted after the prefill and no longer match their hashes."""
        return False

    @classmethod
    def merge(cls, specs: list[Any]) -> RippleSpec:
        """Merge the specs of one KV-cache group; ``AssertionError`` unless all are ``RippleSpec`` of one tier.

        Args:
            specs: the layers' specs.
        """
        assert all(isinstance(s, RippleSpec) for s in specs), "a RippleKV group holds RippleSpec layers only"
        tiers = {s.tier for s in specs}
        assert len(tiers) == 1, (
            f"RippleKV layers of different groups {[t[1] for t in tiers]} cannot share a KV-cache group"
        )
        base = FullAttentionSpec.merge(specs)
        budgets, group, window, kernel_size = tiers.pop()
        return cls(**_base_fields(base), budgets=budgets, group=group, window=window, kernel_size=kernel_size)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether every spec of ``kv_cache_specs`` is a ``RippleSpec`` of this group.

        Args:
            kv_cache_specs: the specs of all layers, by layer name.
        """
        return all(isinstance(s, RippleSpec) and s.tier == self.tier for s in kv_cache_specs.values())


def ripple_spec_from(
    spec: FullAttentionSpec, budgets: GroupBudgets, group: int, window: int, kernel_size: int
) -> RippleSpec:
    """``spec`` (a layer's stock spec) as a :class:`RippleSpec` of group ``group`` of ``budgets``.

    Args:
        spec: the layer's ``FullAttentionSpec``.
        budgets: every group's kept prompt blocks.
        group: the layer's group.
        window: SnapKV's observation window.
        kernel_size: SnapKV's pooling kernel.
    """
    return RippleSpec(
        **_base_fields(spec), budgets=budgets, group=int(group), window=int(window), kernel_size=int(kernel_size)
    )
