"""``KVPool``: every layer's paged KV cache seen as one pool of pages, so a layer can keep more blocks than another.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps a
different number of prompt blocks in each layer. vLLM gives every layer of a KV-cache group the same block ids, and
one KV-cache group per layer would make its scheduler and runner plan every layer's blocks every step. The plugin
serves all layers from one group instead: vLLM 0.32.0 lays the layers' caches out in one buffer (``allocate_kv_cache``),
so block id ``b`` of layer ``l`` is one page of that buffer, and the buffer is one tensor of pages
``[P, H, bs, 2 D]`` in which layer ``l``'s block ``b`` is page ``offsets[l] + b * stride``.

After a prompt's prefill each layer reads and writes pages through its own block table into the pool: a request
that keeps ``M`` block ids owns their ``M x L`` pages, and its layers' kept blocks are packed into them in layer order
(:func:`ripplekv_vllm.plan.plan_step`), so a sensitive layer keeps more blocks than ``M`` while another keeps fewer.
Tokens after the prompt's last whole block stay where vLLM writes them (page ``offsets[l] + b * stride``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["KVPool"]


@dataclass(frozen=True)
class KVPool:
    """The layers' caches as one tensor of pages (see the module).

    Attributes:
        tensor: the pages, ``[P, H, bs, 2 D]`` (the CPU backend's layout), sharing the layers' storage.
        offsets: per layer (in model order), the page of its block 0, ``[L]`` int64.
        stride: pages between a layer's consecutive block ids.
    """

    tensor: torch.Tensor
    offsets: torch.Tensor
    stride: int

    @property
    def num_layers(self) -> int:
        """The layers sharing the pool."""
        return int(self.offsets.shape[0])

    @classmethod
    def of_layers(cls, caches: Sequence[torch.Tensor]) -> KVPool:
        """The pool of the layers' cache views, in model order.

        Args:
            caches: each layer's ``[B, H, bs, 2 D]`` view, all of one storage with equal shapes and strides.

        Raises:
            ValueError: views that are not pages of one buffer at whole-page offsets (another allocator's layout).
        """
        if not caches:
            raise ValueError("no layer caches to pool")
        first = caches[0]
        inner = first.shape[1:]
        page = 1
        for size in inner:
            page *= int(size)
        contiguous = torch.empty(inner, dtype=first.dtype, device="meta").stride()
        base = min(c.storage_offset() for c in caches)
        offsets, stride = [], first.stride(0)
        for cache in caches:
            if (
                cache.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or cache.shape != first.shape
                or cache.stride() != first.stride()
                or tuple(cache.stride()[1:]) != tuple(contiguous)
                or (cache.storage_offset() - base) % page
                or stride % page
            ):
                raise ValueError(
                    "ripplekv: the layers' KV caches are not whole pages of one buffer (shape "
                    f"{tuple(first.shape)}, strides {first.stride()}): the plugin serves vLLM 0.32.0's layout"
                )
            offsets.append((cache.storage_offset() - base) // page)
        num_blocks = int(first.shape[0])
        pages = max(offsets) + (num_blocks - 1) * (stride // page) + 1
        tensor = torch.as_strided(first, (pages, *inner), (page, *contiguous), base)
        return cls(tensor, torch.tensor(offsets, dtype=torch.int64), stride // page)

    def pages(self, layer: int, block_ids: torch.Tensor) -> torch.Tensor:
        """The pages of ``block_ids`` of ``layer`` (int64, ``block_ids``' shape)."""
        return self.offsets[layer] + block_ids.long() * self.stride
