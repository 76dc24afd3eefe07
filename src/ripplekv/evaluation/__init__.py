"""Evaluation: LongBench protocol and metrics, the RULER-style suite, the ``ripplekv eval`` runner and its report."""

from ripplekv.evaluation import longbench, metrics, ruler, runner
from ripplekv.evaluation import report  # noqa: I001 - after runner, which it imports

__all__ = ["longbench", "metrics", "report", "ruler", "runner"]
