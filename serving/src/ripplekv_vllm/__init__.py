"""RippleKV inside vLLM (CPU build 0.32.0): per-layer KV-cache budgets served by paged attention.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) gives each
Transformer layer its own KV-cache budget, from a per-layer sensitivity profile, and keeps each layer's budget of
SnapKV-ranked prompt tokens. This plugin serves it in vLLM:

* each layer keeps the library's budget for the prompt's own length in whole blocks (:mod:`ripplekv_vllm.budgets`);
  every layer is served from one KV-cache group whose block ids are pages of every layer
  (:mod:`ripplekv_vllm.spec`, :mod:`ripplekv_vllm.pool`), so vLLM plans one block table per step, as for uniform
  SnapKV;
* after a prompt's prefill, the scheduler-side manager frees the block ids its layers' kept blocks do not fill
  (:mod:`ripplekv_vllm.hole`, :mod:`ripplekv_vllm.manager`), and the attention backend packs each layer's kept
  tokens into the pages of the block ids left and reads them there from then on (:mod:`ripplekv_vllm.backend`,
  :mod:`ripplekv_vllm.plan`, :mod:`ripplekv_vllm.selection`);
* the platform checks the settings where the engine is configured, so a refusal reaches the caller under the
  multiprocess engine too, and selects the plugin's worker (:mod:`ripplekv_vllm.platform`); the worker and model
  runner give each layer the RippleKV spec and backend, in the engine that configures the plugin only
  (:mod:`ripplekv_vllm.worker`, :mod:`ripplekv_vllm.runner`), and check every step's blocks against the holes
  (:mod:`ripplekv_vllm.ledger`); the settings are ``additional_config["ripplekv"]`` (:mod:`ripplekv_vllm.config`);
* for measuring, not serving: a logits processor that records the full cache's per-token distributions and
  teacher-forces compressed requests along the full cache's answers, for KL(full || compressed) per served token
  (:mod:`ripplekv_vllm.fidelity`).

:func:`register` is the ``vllm.general_plugins`` entry point (``ripplekv = ripplekv_vllm:register``), which vLLM
calls in every process it starts; :func:`ripplekv_vllm.platform.activate` is the ``vllm.platform_plugins`` one.
"""

from __future__ import annotations

__all__ = ["WORKER_CLS", "register"]

WORKER_CLS = "ripplekv_vllm.worker.RippleCPUWorker"
"""The engine's ``worker_cls`` that turns the plugin on."""

_registered = False


def register() -> None:
    """Register the RippleKV spec and its manager with vLLM's KV-cache-spec registry; a no-op when repeated.

    vLLM's own specs are registered first (``register_all_kvcache_specs``): its registry fills itself only while
    empty, so a plugin that registers first would leave ``FullAttentionSpec`` without a manager. Only
    ``RippleSpec`` layers, which the plugin's runner alone creates, use the entry: an engine that does not
    configure RippleKV is untouched (the attention backend is given per engine, by the runner).
    """
    global _registered
    if _registered:
        return
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from ripplekv_vllm.manager import RippleManager
    from ripplekv_vllm.spec import RippleSpec

    register_all_kvcache_specs(None)
    KVCacheSpecRegistry.register(RippleSpec, RippleManager, uniform_type_base_spec=RippleSpec)
    _registered = True
