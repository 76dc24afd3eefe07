"""``RippleSpec``: a full-attention KV-cache spec that carries its RippleKV tier (Xu et al., 2026).

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps a
different share of the prompt in each layer. vLLM groups layers into KV-cache groups by their spec, and one
manager serves each group, so a tier is a spec: a :class:`FullAttentionSpec` with the tier's ``keep_fraction``
and the SnapKV scorer settings (``window``, ``kernel_size``).

Two overrides keep tiers in separate groups (vLLM 0.32.0's ``get_kv_cache_groups``): :meth:`RippleSpec.merge`
raises ``AssertionError`` (the exception vLLM catches to tell groups apart) for specs of different tiers, where
the inherited merge would silently drop the tier fields, and :meth:`RippleSpec.is_uniform_with_collection`
compares the tier fields, where the inherited check would put every ``RippleSpec`` into one uniform group. The
spec is registered with itself as its uniform base (``ripplekv_vllm.register``), not under ``FullAttentionSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec

__all__ = ["RippleSpec", "ripple_spec_from"]


def _base_fields(spec: FullAttentionSpec) -> dict[str, Any]:
    """The constructor arguments of ``spec`` as a plain :class:`FullAttentionSpec`."""
    return {f.name: getattr(spec, f.name) for f in fields(FullAttentionSpec) if f.init}


@dataclass(frozen=True, kw_only=True)
class RippleSpec(FullAttentionSpec):
    """A full-attention layer of one RippleKV tier.

    Attributes:
        keep_fraction: the tier's kept fraction of each prompt, in ``(0, 1]`` (1: nothing is evicted).
        window: SnapKV's observation window, always kept.
        kernel_size: SnapKV's pooling kernel.
    """

    keep_fraction: float = 1.0
    window: int = 64
    kernel_size: int = 5

    @property
    def tier(self) -> tuple[float, int, int]:
        """The fields that tell tiers apart."""
        return (self.keep_fraction, self.window, self.kernel_size)

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
        assert len(tiers) == 1, f"RippleKV layers of different tiers {sorted(tiers)} cannot share a KV-cache group"
        base = FullAttentionSpec.merge(specs)
        keep_fraction, window, kernel_size = tiers.pop()
        return cls(**_base_fields(base), keep_fraction=keep_fraction, window=window, kernel_size=kernel_size)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether every spec of ``kv_cache_specs`` is a ``RippleSpec`` of this tier.

        Args:
            kv_cache_specs: the specs of all layers, by layer name.
        """
        return all(isinstance(s, RippleSpec) and s.tier == self.tier for s in kv_cache_specs.values())


def ripple_spec_from(spec: FullAttentionSpec, keep_fraction: float, window: int, kernel_size: int) -> RippleSpec:
    """``spec`` (a layer's stock spec) as a :class:`RippleSpec` of the given tier.

    Args:
        spec: the layer's ``FullAttentionSpec``.
        keep_fraction: the tier's kept fraction, in ``(0, 1]``.
        window: SnapKV's observation window.
        kernel_size: SnapKV's pooling kernel.
    """
    return RippleSpec(
        **_base_fields(spec), keep_fraction=float(keep_fraction), window=int(window), kernel_size=int(kernel_size)
    )
