"""``RippleCPUWorker``: vLLM's CPU worker with the RippleKV model runner (the engine's ``worker_cls``).

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) needs its own
model runner (:class:`~ripplekv_vllm.runner.RippleRunner`), and vLLM's ``CPUWorker.init_device`` constructs the
stock one inline, so the worker checks the plugin's settings (a bad configuration fails before the model loads), runs
the stock ``init_device`` and replaces its runner. The plugin's platform (:mod:`ripplekv_vllm.platform`) selects this
worker for an engine with ``additional_config["ripplekv"]``; without that entry the worker keeps the stock runner."""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from ripplekv_vllm.platform import check_engine
from ripplekv_vllm.runner import RippleRunner

__all__ = ["RippleCPUWorker"]


class RippleCPUWorker(CPUWorker):
    """A ``CPUWorker`` serving with :class:`RippleRunner`."""

    def init_device(self) -> None:
        """Check the settings (:func:`~ripplekv_vllm.platform.check_engine`, as the caller's platform did), initialise
        the device as the stock worker does, then swap in the RippleKV runner.

        Raises:
            RippleConfigError: on invalid settings, engine settings the plugin refuses, another vLLM version, or the
                V2 model runner.
        """
        config = check_engine(self.vllm_config)
        super().init_device()
        if config is not None:
            self.model_runner = RippleRunner(self.vllm_config, torch.device("cpu"), ripple_config=config)
