"""``ripplekv profile --workers N``: actors score whole samples; the driver checkpoints them as a single process does
(either resumes the other) and assembles the same profile (given the same torch threads per process)."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.distributed import (
    DEFAULT_MAX_ATTEMPTS,
    StreamWorker,
    WorkerPool,
    actor_options,
    check_workers,
    ray_session,
)
from ripplekv.profiling.calibration import CalibrationSet
from ripplekv.profiling.checkpoint import SampleScores
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, calibration_ids, collect_profile, score_sample

ModelFactory = Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
CalibrationFactory = Callable[[PreTrainedTokenizerBase], CalibrationSet]


class ProfileWorker(StreamWorker):
    """The Ray actor of a profiling run: one model (``model_factory``, picklable), one sample at a time."""

    def __init__(
        self,
        config: ProfilingConfig,
        model_factory: ModelFactory,
        hook: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        super().__init__(hook)
        self.config = config
        self.model_factory = model_factory
        self.model: PreTrainedModel | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None

    def setup(self) -> dict[str, Any]:
        """Load the model; return its identity and weights fingerprint (the checkpoint's key)."""
        from ripplekv.models.identity import model_identity, weights_fingerprint

        self.model, self.tokenizer = self.model_factory()
        return {"identity": model_identity(self.model), "fingerprint": weights_fingerprint(self.model)}

    def calibration(self, factory: CalibrationFactory) -> CalibrationSet:
        """The calibration set the picklable ``factory`` builds with this actor's tokenizer."""
        if self.tokenizer is None:
            raise RuntimeError("ProfileWorker.calibration called before setup")
        return factory(self.tokenizer)

    def items(self, key: Hashable, *args: Any) -> Iterator[SampleScores]:
        """The scores of the sample ``args[0]``, index ``key`` (the noise seed)."""
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("ProfileWorker.items called before setup")
        (sample,) = args
        context_ids, continuation_ids = calibration_ids(self.model, self.tokenizer, sample, self.config)
        yield score_sample(self.model, context_ids, continuation_ids, self.config, sample_index=int(key))


def profile_model_ray(
    model_factory: ModelFactory,
    calibration: CalibrationSet | CalibrationFactory,
    config: ProfilingConfig | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 2,
    ray_address: str | None = None,
    device: str | None = None,
    worker_hook: Callable[[Hashable, int], None] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> SensitivityProfile:
    """:func:`~ripplekv.profiling.sensitivity.profile_model` with the samples scored on ``workers`` Ray actors, each
    loading the model with the picklable ``model_factory`` (on ``device``; ``cpu`` asks for CPU actors).
    ``calibration`` may be a picklable ``tokenizer -> CalibrationSet``, run on one actor (the driver never loads the
    model)."""
    check_workers(workers)
    config = config or ProfilingConfig()
    if not isinstance(calibration, CalibrationSet) and not callable(calibration):
        raise TypeError(f"calibration must be a CalibrationSet or a callable, got {type(calibration).__name__}")
    with ray_session(ray_address) as ray:
        options = actor_options(ray, workers, device)
        pool = WorkerPool(ray, ProfileWorker, (config, model_factory, worker_hook), workers, options, max_attempts)
        try:
            description = pool.start()
            if not isinstance(calibration, CalibrationSet):
                calibration = pool.call(0, "calibration", calibration)
                if not isinstance(calibration, CalibrationSet):
                    raise TypeError(f"the calibration factory returned a {type(calibration).__name__}")
            calib: CalibrationSet = calibration

            def run(pending: list[int], on_item: Callable[[int, SampleScores], None]) -> None:
                pool.run(pending, lambda index: (calib.samples[int(index)],), on_item)  # type: ignore[arg-type]

            identity, fingerprint = description["identity"], description["fingerprint"]
            return collect_profile(identity, fingerprint, calib, config, checkpoint, progress, run)
        finally:
            pool.close()
