"""``RippleManager``: the scheduler side of the RippleKV vLLM plugin, freeing each request's hole.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps each
layer's share of the prompt, packed into the pages of the request's first block ids (:mod:`ripplekv_vllm.pool`), and
evicts the rest after the prefill. Once a request's whole prompt has been
processed, :meth:`RippleManager.remove_skipped_blocks` (which vLLM's ``KVCacheManager.allocate_slots`` calls
before allocating the step's new blocks, with the request's prompt length) hands the prompt blocks of the hole
``[k, T)`` (:meth:`ripplekv_vllm.spec.RippleSpec.hole`) back to the block pool and puts the null block in their
place, as vLLM's own R-SWA manager frees a middle gap. Later positions keep their logical block indices.
"""

from __future__ import annotations

from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

from ripplekv_vllm.spec import RippleSpec

__all__ = ["RippleManager"]


class RippleManager(FullAttentionManager):
    """The KV-cache manager of a RippleKV engine's group (a ``FullAttentionManager`` that frees the hole)."""

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the hole's blocks of a request whose prompt has been processed; nothing before that.

        Args:
            request_id: the request.
            processed_computed_tokens: tokens whose KV is computed and committed.
            num_prompt_tokens: the request's prompt length ``N`` (None: nothing is freed).
        """
        spec = self.kv_cache_spec
        if num_prompt_tokens is None or processed_computed_tokens < num_prompt_tokens or num_prompt_tokens < 1:
            return
        assert isinstance(spec, RippleSpec), f"RippleManager serves RippleSpec groups, got {type(spec).__name__}"
        kept, full = spec.hole(int(num_prompt_tokens))
        if kept < full:
            self._remove_blocks_in_range(request_id, kept // self.block_size, full // self.block_size)
