"""Ray plumbing of ``--workers N``: keyed units (samples) on actors that load the model once and stream each result
to the driver as it exists; a unit whose actor dies is requeued with what is missing of it. Ray is optional.

The requeue is written here rather than left to Ray's ``max_restarts`` / ``max_task_retries``: Ray retries a call on
an actor rebuilt by its constructor, so the unit a ``next_item`` call was streaming is gone, and a streaming
generator's retry runs the unit again from its start; here the driver hands the unit out again with only what it has
not received (``arguments(key)``), and a replacement actor's setup is checked against the others'."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ripplekv.validation import check_int

logger = logging.getLogger(__name__)

RAY_INSTALL = "pip install 'ripplekv[ray]'"
DEFAULT_MAX_ATTEMPTS = 3


class WorkerLostError(RuntimeError):
    """A unit lost its worker as many times as it may."""


def require_ray() -> ModuleType:
    """The ``ray`` module; ImportError with the install command when it is missing."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(f"--workers N > 1 and --ray-address need Ray, which is not installed: {RAY_INSTALL}") from err
    return ray


def check_workers(workers: object, name: str = "workers") -> None:
    """Raise ValueError unless ``workers`` is an integer >= 1."""
    check_int(name, workers)


@contextmanager
def ray_session(address: str | None = None) -> Iterator[ModuleType]:
    """Ray, connected: the process's connection, else a new one to ``address`` (``auto``, ``ray://host:10001``,
    ``host:6379``; None: a local cluster), shut down on exit."""
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def actor_options(ray: ModuleType, workers: int, device: str | None = None) -> dict[str, Any]:
    """Ray resources of one actor: one GPU where the cluster has GPUs (unless ``device`` is ``cpu``), else
    ``1/workers`` of its CPUs; ValueError when the cluster cannot hold ``workers`` actors at once."""
    check_workers(workers)
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus >= 1 and (device is None or not str(device).startswith("cpu")):
        if workers > gpus:
            raise ValueError(
                f"{workers} workers need one GPU each, but the Ray cluster has {gpus}: use --workers {gpus}"
            )
        return {"num_gpus": 1}
    cpus = int(resources.get("CPU", 0))
    if workers > cpus:
        raise ValueError(f"{workers} workers need one CPU each at least, but the Ray cluster has {cpus} CPUs")
    return {"num_cpus": max(1, cpus // workers)}


class StreamWorker(ABC):
    """Base class of the actors. ``hook`` (picklable, for tests) is called as ``hook(key, items handed over so
    far)`` before each :meth:`next_item`."""

    def __init__(self, hook: Callable[[Hashable, int], None] | None = None) -> None:
        self._hook = hook
        self._key: Hashable = None
        self._items: Iterator[Any] | None = None
        self._count = 0

    @abstractmethod
    def setup(self) -> Any:
        """Load the model and whatever the units need; return a description the driver checks."""

    @abstractmethod
    def items(self, key: Hashable, *args: Any) -> Iterator[Any]:
        """The results of one unit, none of them None."""

    def begin(self, key: Hashable, *args: Any) -> None:
        """Start a unit (the previous one, if unfinished, is dropped)."""
        self._key, self._items, self._count = key, self.items(key, *args), 0

    def next_item(self) -> Any:
        """The next result of the current unit, or None when it has no more."""
        if self._items is None:
            raise RuntimeError("next_item called with no unit begun")
        if self._hook is not None:
            self._hook(self._key, self._count)
        item = next(self._items, None)
        if item is None:
            self._items = None
            return None
        self._count += 1
        return item


class WorkerPool:
    """``workers`` actors of one :class:`StreamWorker` subclass (constructed with the picklable ``args``, given Ray
    ``options``) and the loop sharing units among them; a unit may lose its actor ``max_attempts`` times."""

    def __init__(
        self,
        ray: ModuleType,
        worker_class: type[StreamWorker],
        args: Sequence[Any],
        workers: int,
        options: dict[str, Any],
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        check_workers(workers)
        check_workers(max_attempts, "max_attempts")
        self.ray = ray
        self.remote_class = ray.remote(worker_class).options(max_restarts=0, max_task_retries=0, **options)
        self.args = tuple(args)
        self.workers = workers
        self.max_attempts = max_attempts
        self.actors: list[Any] = []
        self.description: Any = None
        self.failures = 0

    def start(self) -> Any:
        """Start the actors and return the description of their :meth:`StreamWorker.setup`; ValueError when two
        differ (e.g. other data files on another node)."""
        self.actors = [self.remote_class.remote(*self.args) for _ in range(self.workers)]
        descriptions = self.ray.get([actor.setup.remote() for actor in self.actors])
        self.description = descriptions[0]
        for index, description in enumerate(descriptions[1:], start=1):
            self._check(description, index)
        return self.description

    def _check(self, description: Any, index: int) -> None:
        if description != self.description:
            raise ValueError(f"Ray worker {index} loaded another setup than worker 0 (model, data or options differ)")

    def call(self, index: int, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` on actor ``index`` and return its result."""
        return self.ray.get(getattr(self.actors[index], method).remote(*args))

    def run(
        self,
        keys: Sequence[Hashable],
        arguments: Callable[[Hashable], tuple[Any, ...] | None],
        on_item: Callable[[Hashable, Any], None],
    ) -> int:
        """Run every unit of ``keys`` (in this order) on the actors; return how many actors were lost.

        ``arguments(key)`` is called each time a unit is handed out (again after a lost actor), None when nothing is
        left of it. WorkerLostError when a unit lost its actor ``max_attempts`` times.
        """
        ray = self.ray
        names = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError")
        lost_errors = tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))
        queue: deque[Hashable] = deque(keys)
        attempts: dict[Hashable, int] = {}
        running: dict[Any, tuple[int, Hashable]] = {}  # next_item ref -> (actor index, unit)
        starting: dict[Any, int] = {}  # setup ref of a replacement actor -> actor index
        idle: set[int] = set()

        def hand_out(index: int) -> None:
            while queue:
                key = queue.popleft()
                args = arguments(key)
                if args is None:
                    continue
                actor = self.actors[index]
                actor.begin.remote(key, *args)  # an actor runs its calls in order: begin, then next_item
                running[actor.next_item.remote()] = (index, key)
                return
            idle.add(index)

        for index in range(len(self.actors)):
            hand_out(index)
        while running or (starting and queue):  # replacements still loading are not waited for once all is done
            (ref,), _ = ray.wait([*running, *starting], num_returns=1)
            if ref in starting:
                index = starting.pop(ref)
                try:
                    description = ray.get(ref)
                except lost_errors as err:
                    raise WorkerLostError(f"a replacement Ray worker died while loading: {err}") from err
                self._check(description, index)
                hand_out(index)
                continue
            index, key = running.pop(ref)
            try:
                item = ray.get(ref)
            except lost_errors as err:
                self.failures += 1
                attempts[key] = attempts.get(key, 0) + 1
                if attempts[key] >= self.max_attempts:
                    raise WorkerLostError(f"unit {key!r} lost its Ray worker {attempts[key]} times: {err}") from err
                logger.warning("Ray worker %d died running %r (%s): rerunning what is missing of it", index, key, err)
                self._kill(self.actors[index])
                self.actors[index] = self.remote_class.remote(*self.args)
                starting[self.actors[index].setup.remote()] = index
                queue.appendleft(key)
                if idle:  # another actor is free: the unit reruns there while the new one loads
                    hand_out(idle.pop())
                continue
            if item is None:
                hand_out(index)
                continue
            on_item(key, item)
            running[self.actors[index].next_item.remote()] = (index, key)
        return self.failures

    def close(self) -> None:
        """Kill the actors."""
        for actor in self.actors:
            self._kill(actor)
        self.actors = []

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # an actor that is already gone
            logger.debug("could not kill a Ray actor", exc_info=True)
