"""The registry of evaluation suites: ``ripplekv eval --suite NAME`` runs ``SUITES[NAME]``.

The runner reaches suites only through this registry and the :class:`~ripplekv_eval.suites.base.Suite` interface.
"""

from __future__ import annotations

from ripplekv_eval.suites.base import Suite
from ripplekv_eval.suites.jsonl import JsonlSuite
from ripplekv_eval.suites.longbench import LongBenchSuite
from ripplekv_eval.suites.needle import NeedleSuite
from ripplekv_eval.suites.ruler import RulerSuite

__all__ = ["SUITES", "Suite", "get_suite", "register_suite"]

SUITES: dict[str, Suite] = {}
"""Registered suites by name, in registration order."""


def register_suite(suite: Suite) -> Suite:
    """Add ``suite`` to :data:`SUITES` under ``suite.name`` (a name already taken is an error)."""
    if not isinstance(suite, Suite):
        raise TypeError(f"expected a Suite, got {type(suite).__name__}")
    if suite.name in SUITES:
        raise ValueError(f"a suite named {suite.name!r} is already registered")
    SUITES[suite.name] = suite
    return suite


def get_suite(name: str) -> Suite:
    """The registered suite ``name``; ValueError naming the registered ones otherwise."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    return SUITES[name]


for _suite in (LongBenchSuite(), RulerSuite(), NeedleSuite(), JsonlSuite()):
    register_suite(_suite)
