"""``RippleSpec``: the full-attention KV-cache spec of every layer of an engine that serves RippleKV (Xu et al., 2026).

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps a
different share of the prompt in each layer. The plugin serves every layer from one KV-cache group, whose block ids
are pages of every layer (:mod:`ripplekv_vllm.pool`): vLLM plans one block table per step, as for uniform SnapKV,
and a request keeps as many block ids as its layers' kept blocks fill (:meth:`GroupBudgets.pooled_hole`). The spec
is a :class:`FullAttentionSpec` with the plugin's :class:`~ripplekv_vllm.budgets.GroupBudgets` and the SnapKV
scorer settings (``window``, ``kernel_size``).

:meth:`RippleSpec.merge` keeps those fields (the inherited merge would drop them) and raises ``AssertionError`` for
specs that differ; the spec is registered with itself as its uniform base (``ripplekv_vllm.register``), not under
``FullAttentionSpec``.
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
    """A full-attention layer of an engine that serves RippleKV.

    Attributes:
        budgets: every layer's kept prompt blocks, from the prompt length (None: nothing is evicted).
        window: SnapKV's observation window, always kept.
        kernel_size: SnapKV's pooling kernel.
    """

    budgets: GroupBudgets | None = None
    window: int = 64
    kernel_size: int = 5

    @property
    def tier(self) -> tuple[GroupBudgets | None, int, int]:
        """The fields beyond ``FullAttentionSpec``'s."""
        return (self.budgets, self.window, self.kernel_size)

    def hole(self, num_prompt_tokens: int) -> tuple[int, int]:
        """``(k, T)``: the block ids ``[k / bs, T / bs)`` of the prompt the group frees (``k == T``: none).

        Args:
            num_prompt_tokens: the prompt length ``N``.
        """
        full = num_prompt_tokens // self.block_size * self.block_size
        if self.budgets is None:
            return full, full
        return self.budgets.pooled_hole(num_prompt_tokens)

    @property
    def prefix_cacheable(self) -> bool:
        """Never: the prompt's blocks are compacted after the prefill and no longer match their hashes."""
        return False

    @classmethod
    def merge(cls, specs: list[Any]) -> RippleSpec:
        """Merge the layers' specs; ``AssertionError`` unless all are one ``RippleSpec`` setting.

        Args:
            specs: the layers' specs.
        """
        assert all(isinstance(s, RippleSpec) for s in specs), "a RippleKV group holds RippleSpec layers only"
        tiers = {s.tier for s in specs}
        assert len(tiers) == 1, "RippleKV layers of different settings cannot share a KV-cache group"
        base = FullAttentionSpec.merge(specs)
        budgets, window, kernel_size = tiers.pop()
        return cls(**_base_fields(base), budgets=budgets, window=window, kernel_size=kernel_size)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether every spec of ``kv_cache_specs`` is a ``RippleSpec`` of this setting.

        Args:
            kv_cache_specs: the specs of all layers, by layer name.
        """
        return all(isinstance(s, RippleSpec) and s.tier == self.tier for s in kv_cache_specs.values())


def ripple_spec_from(spec: FullAttentionSpec, budgets: GroupBudgets, window: int, kernel_size: int) -> RippleSpec:
    """``spec`` (a layer's stock spec) as a :class:`RippleSpec`.

    Args:
        spec: the layer's ``FullAttentionSpec``.
        budgets: every layer's kept prompt blocks.
        window: SnapKV's observation window.
        kernel_size: SnapKV's pooling kernel.
    """
    return RippleSpec(**_base_fields(spec), budgets=budgets, window=int(window), kernel_size=int(kernel_size))
