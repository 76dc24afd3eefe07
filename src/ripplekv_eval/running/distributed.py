"""``ripplekv eval --workers N [--ray-address ADDR]``: the evaluation sharded over Ray actors.

Each actor loads the model once and runs whole samples; the driver alone writes the folder, a row at a time, with
``run_eval``'s resume (rows equal a single-process run's, timing aside). A dead actor's sample is handed out again
with the configurations not yet received (:mod:`ripplekv.distributed`). Paths must be readable on every node.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.distributed import (
    StreamWorker,
    WorkerPool,
    actor_options,
    check_workers,
    ray_session,
)
from ripplekv_eval.running.budget_rows import budget_value
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RunFolder, RunResult, row_key
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.running.runner import RunProfiles, load_run_profiles, open_run_folder, prepare

ModelFactory = Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
"""A picklable callable that loads the model and its tokenizer (called once on every actor)."""


class EvalWorker(StreamWorker):
    """The Ray actor of an evaluation: one model, every sample of the run, one sample at a time.

    ``oracles``: the damage profiles of ``ripplekv-oracle``; ``hook``: see :class:`~ripplekv.distributed.StreamWorker`.
    """

    def __init__(
        self,
        config: EvalConfig,
        profiles: RunProfiles,
        model_factory: ModelFactory,
        hook: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        super().__init__(hook)
        self.config = config
        self.profiles = profiles
        self.model_factory = model_factory
        self.runner: SampleRunner | None = None
        self.samples: dict[str, Any] = {}

    def setup(self) -> dict[str, Any]:
        """Load the model, build the presses and samples; return the resolved configuration and the sample ids."""
        self.runner, samples, resolved = prepare(self.config, self.profiles, *self.model_factory())
        self.samples = {sample.id: sample for sample in samples}
        return {"resolved": resolved, "samples": [sample.id for sample in samples]}

    def items(self, key: Hashable, *args: Any) -> Iterator[dict[str, Any]]:
        """The rows of one sample; ``args``: its pending ``(method, budget)`` pairs, the full cache's answer or None."""
        if self.runner is None:
            raise RuntimeError("EvalWorker.items called before setup")
        pending, answer = args
        return self.runner.run_sample(self.samples[str(key)], [(m, budget_value(b)) for m, b in pending], answer)


def run_eval_ray(
    config: EvalConfig,
    out: str | os.PathLike[str],
    workers: int = 2,
    ray_address: str | None = None,
    progress: bool = True,
    worker_hook: Callable[[Hashable, int], None] | None = None,
) -> RunResult:
    """Run (or resume) the evaluation ``config`` into ``out`` on ``workers`` Ray actors (``worker_hook``: called on the
    actors before each row, for tests)."""
    from tqdm import tqdm

    from ripplekv.models.loading import load_model

    start = time.perf_counter()
    check_workers(workers)
    profiles = load_run_profiles(config)  # read here, as run_eval reads them, and sent to the actors
    model_factory = functools.partial(load_model, config.model, dtype=config.dtype, device=config.device)
    with ray_session(ray_address) as ray:
        options = actor_options(ray, workers, config.device)
        worker_args = (config, profiles, model_factory, worker_hook)
        pool = WorkerPool(ray, EvalWorker, worker_args, workers, options)
        folder: RunFolder | None = None
        try:
            description = pool.start()
            folder = open_run_folder(config, out, description["resolved"], profiles)
            log, done, answers = folder.log, folder.done, folder.answers
            sample_ids: list[str] = description["samples"]
            configurations = config.configurations
            total = len(sample_ids) * len(configurations)
            already = sum((sample, m, b) in done for sample in sample_ids for m, b in configurations)

            def arguments(key: Hashable) -> tuple[Any, ...] | None:
                pending = [(m, b) for m, b in configurations if (str(key), m, b) not in done]
                return (pending, answers.get(str(key))) if pending else None

            written = 0
            with tqdm(
                total=total, initial=already, desc=f"eval {config.suite}", unit="run", disable=not progress
            ) as bar:

                def on_item(key: Hashable, row: dict[str, Any]) -> None:
                    nonlocal written
                    if row_key(row) in done or str(row["sample_id"]) != str(key):
                        raise RuntimeError(f"a Ray worker returned an unexpected row {row_key(row)} for {key!r}")
                    log.append(row)
                    done.add(row_key(row))
                    if row["method"] == "full" and row.get("answer_ids"):
                        answers[str(key)] = [int(t) for t in row["answer_ids"]]
                    written += 1
                    bar.update(1)

                pool.run(sample_ids, arguments, on_item)
        finally:
            pool.close()
            if folder is not None:
                folder.close()  # its lock
    seconds = time.perf_counter() - start
    return RunResult(folder.out, len(log.read()), written, len(sample_ids), seconds, configurations=len(configurations))
