"""``RippleRunner``: the CPU model runner that gives each layer its RippleKV tier's KV-cache spec.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) assigns
budgets per layer, but vLLM's attention layers and backends do not know which layer they are
(``customize_spec`` gets no layer name). The runner does: :meth:`RippleRunner.get_kv_cache_spec` turns each
layer's stock ``FullAttentionSpec`` into a :class:`~ripplekv_vllm.spec.RippleSpec` of its tier (the layer index
read from its name), and :meth:`RippleRunner.initialize_kv_cache` lends every
:class:`~ripplekv_vllm.backend.RippleBuilder` the rows' prompt lengths (the input batch's
``num_prompt_tokens_cpu_tensor``, in the order of the metadata rows), which the builders need to find the hole.
Without ``additional_config["ripplekv"]`` the runner is the stock ``CPUModelRunner``.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.models.utils import extract_layer_index
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from ripplekv_vllm.backend import RippleBuilder
from ripplekv_vllm.config import RippleConfig, RippleConfigError
from ripplekv_vllm.spec import ripple_spec_from

__all__ = ["RippleRunner"]


class RippleRunner(CPUModelRunner):
    """A ``CPUModelRunner`` whose layers get RippleKV tier specs (see the module)."""

    def __init__(self, vllm_config: Any, device: torch.device, ripple_config: RippleConfig | None = None) -> None:
        """Build the stock runner and resolve the plugin's settings.

        Args:
            vllm_config: the engine's ``VllmConfig``.
            device: the device (CPU).
            ripple_config: the resolved settings (default: read from ``vllm_config.additional_config``).

        Raises:
            RippleConfigError: on invalid settings.
        """
        self.ripple_config = ripple_config if ripple_config is not None else RippleConfig.from_vllm_config(vllm_config)
        super().__init__(vllm_config, device)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """The stock specs, each layer's as a ``RippleSpec`` of its tier when the plugin is configured.

        Raises:
            RippleConfigError: a layer that is not plain full attention (sliding window, MLA, ...), which the plugin
                does not serve.
        """
        specs = super().get_kv_cache_spec()
        config = self.ripple_config
        if config is None:
            return specs
        out: dict[str, KVCacheSpec] = {}
        for name, spec in specs.items():
            if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
                raise RippleConfigError(
                    f"ripplekv serves full-attention layers only; layer {name} has a {type(spec).__name__}"
                )
            layer = extract_layer_index(name)
            out[name] = ripple_spec_from(spec, config.layer_keep_fractions[layer], config.window, config.kernel_size)
        return out

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> None:
        """The stock initialisation, then every ``RippleBuilder`` is bound to the input batch's prompt lengths.

        Args:
            args: ``CPUModelRunner.initialize_kv_cache``'s arguments.
            kwargs: its keyword arguments.
        """
        super().initialize_kv_cache(*args, **kwargs)
        for groups in self.attn_groups:
            for group in groups:
                for builder in group.metadata_builders:
                    if isinstance(builder, RippleBuilder):
                        builder.bind(self._prompt_lens)

    def _prompt_lens(self, num_reqs: int) -> torch.Tensor:
        """The first ``num_reqs`` rows' prompt lengths (read at call time: the input batch can be rebuilt)."""
        return self.input_batch.num_prompt_tokens_cpu_tensor[:num_reqs]
