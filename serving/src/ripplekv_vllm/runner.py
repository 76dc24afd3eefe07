"""``RippleRunner``: the CPU model runner of an engine that configures RippleKV.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) assigns
budgets per layer, but vLLM's attention layers and backends do not know which layer they are
(``customize_spec`` gets no layer name). The runner does, and wires the plugin into its own engine only:

* :meth:`RippleRunner.load_model` gives this engine's attention layers the RippleKV backend
  (:class:`~ripplekv_vllm.backend.RippleCPUAttentionBackend` and :class:`~ripplekv_vllm.backend.RippleImpl`), after
  refusing layers the plugin cannot serve (sliding window, ALiBi, anything but vLLM's CPU attention); no other
  engine in the process is touched;
* :meth:`RippleRunner.get_kv_cache_spec` turns each layer's stock ``FullAttentionSpec`` into the engine's
  :class:`~ripplekv_vllm.spec.RippleSpec`, so that every layer is in one KV-cache group;
* :meth:`RippleRunner.initialize_kv_cache` sees the layers' caches as one pool of pages
  (:class:`~ripplekv_vllm.pool.KVPool`), tells each layer's implementation its index, lends every
  :class:`~ripplekv_vllm.backend.RippleBuilder` the rows' prompt lengths and request ids (the input batch's, in the
  order of the metadata rows), the pool, the runner's :class:`~ripplekv_vllm.stash.PromptStash` and its
  :class:`~ripplekv_vllm.backend.PendingWrites`, and builds the :class:`~ripplekv_vllm.ledger.BlockLedger` from the
  builders' holes;
* :meth:`RippleRunner.execute_model` checks each step's blocks against the ledger before the step runs, drops
  the pieces kept aside for finished and preempted requests, and writes the step's compactions once its forward is
  done.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import get_layers_from_vllm_config
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.models.utils import extract_layer_index
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from ripplekv_vllm.backend import PendingWrites, RippleBuilder, RippleCPUAttentionBackend, RippleImpl
from ripplekv_vllm.config import RippleConfig, RippleConfigError
from ripplekv_vllm.ledger import BlockLedger
from ripplekv_vllm.pool import KVPool
from ripplekv_vllm.spec import RippleSpec, ripple_spec_from
from ripplekv_vllm.stash import PromptStash

__all__ = ["RippleRunner"]


class RippleRunner(CPUModelRunner):
    """A ``CPUModelRunner`` whose layers get RippleKV group specs and the RippleKV backend (see the module)."""

    def __init__(self, vllm_config: Any, device: torch.device, ripple_config: RippleConfig) -> None:
        """Build the stock runner with the plugin's resolved settings.

        Args:
            vllm_config: the engine's ``VllmConfig``.
            device: the device (CPU).
            ripple_config: the resolved settings.
        """
        self.ripple_config = ripple_config
        self.ledger: BlockLedger | None = None
        self.stash = PromptStash()
        self.pending = PendingWrites()
        self.pool: KVPool | None = None
        super().__init__(vllm_config, device)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the model as the stock runner does, then give its attention layers the RippleKV backend.

        Args:
            args: ``CPUModelRunner.load_model``'s arguments.
            kwargs: its keyword arguments.

        Raises:
            RippleConfigError: a layer with a sliding window, ALiBi or another attention implementation.
        """
        super().load_model(*args, **kwargs)
        for name, layer in get_layers_from_vllm_config(self.vllm_config, Attention).items():
            impl = layer.impl
            if type(impl) is not CPUAttentionBackendImpl:
                raise RippleConfigError(
                    f"ripplekv serves vLLM's CPU attention only; layer {name} uses {type(impl).__name__}"
                )
            if impl.alibi_slopes is not None:
                raise RippleConfigError(
                    f"ripplekv: layer {name} uses ALiBi, whose bias the kernel computes from distances in the cache; "
                    "after compaction those are no longer the true ones (RippleKV serves RoPE and other schemes "
                    "applied before the cache)"
                )
            if impl.sliding_window != -1:
                raise RippleConfigError(
                    f"ripplekv serves full-attention layers only; layer {name} has a sliding window of "
                    f"{impl.sliding_window} tokens"
                )
            layer.attn_backend = RippleCPUAttentionBackend
            layer.impl = RippleImpl.of(impl, extract_layer_index(name))

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """The stock specs, each layer's as the engine's ``RippleSpec`` (one KV-cache group).

        Raises:
            RippleConfigError: a layer that is not plain full attention (sliding window, MLA, ...), which the plugin
                does not serve.
        """
        config = self.ripple_config
        out: dict[str, KVCacheSpec] = {}
        for name, spec in super().get_kv_cache_spec().items():
            if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
                raise RippleConfigError(
                    f"ripplekv serves full-attention layers only; layer {name} has a {type(spec).__name__}"
                )
            out[name] = ripple_spec_from(spec, config.budgets, config.window, config.kernel_size)
        return out

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> None:
        """The stock initialisation; then the pool, the builders' bindings and the ledger.

        Args:
            args: ``CPUModelRunner.initialize_kv_cache``'s arguments.
            kwargs: its keyword arguments.

        Raises:
            RippleConfigError: more than one KV-cache group, or a group read in kernel blocks unlike the blocks its
                manager frees.
        """
        super().initialize_kv_cache(*args, **kwargs)
        groups = self.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise RippleConfigError(
                f"ripplekv serves every layer from one KV-cache group; vLLM made {len(groups)} of this model's layers"
            )
        layers = get_layers_from_vllm_config(self.vllm_config, Attention)
        caches = sorted((extract_layer_index(name), layer.kv_cache) for name, layer in layers.items())
        if [index for index, _ in caches] != list(range(len(caches))):
            raise RippleConfigError(f"ripplekv: attention layers {[i for i, _ in caches]} are not 0..L-1")
        self.pool = KVPool.of_layers([cache for _, cache in caches])
        for attn_groups in self.attn_groups:
            for group in attn_groups:
                for builder in group.metadata_builders:
                    if isinstance(builder, RippleBuilder):
                        if builder.block_size != groups[0].kv_cache_spec.block_size:
                            raise RippleConfigError(
                                f"ripplekv: the KV cache is read in kernel blocks of {builder.block_size} tokens but "
                                f"managed in blocks of {groups[0].kv_cache_spec.block_size}: the worker's hole would "
                                "not be the scheduler's (the CPU build never splits blocks)"
                            )
                        builder.bind(self._prompt_lens, self._request_ids, self.stash, self.pool, self.pending)
        spec = groups[0].kv_cache_spec
        if isinstance(spec, RippleSpec):
            self.ledger = BlockLedger([spec.hole], [spec.block_size])

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        """Check the step's blocks against the ledger, then run the step as the stock runner does.

        Args:
            scheduler_output: the step's ``SchedulerOutput``.
            args: ``CPUModelRunner.execute_model``'s other arguments.
            kwargs: its keyword arguments.

        Raises:
            HoleMismatchError: the scheduler handed out a block a live request still reads.
        """
        if self.ledger is not None:
            self.ledger.update(scheduler_output)
        self.stash.drop(scheduler_output.finished_req_ids | (scheduler_output.preempted_req_ids or set()))
        out = super().execute_model(scheduler_output, *args, **kwargs)
        if len(self.pending):
            assert self.pool is not None
            self.pending.flush(self.pool)
        return out

    def _prompt_lens(self, num_reqs: int) -> torch.Tensor:
        """The first ``num_reqs`` rows' prompt lengths (read at call time: the input batch can be rebuilt)."""
        return self.input_batch.num_prompt_tokens_cpu_tensor[:num_reqs]

    def _request_ids(self) -> list[str | None]:
        """The rows' request ids (read at call time, as the prompt lengths)."""
        return list(self.input_batch.req_ids)
