"""Evaluation: LongBench protocol and metrics, the RULER-style suite, the ``ripplekv eval`` runner and its report."""

from ripplekv.evaluation import longbench, metrics, report, ruler, runner

__all__ = ["longbench", "metrics", "report", "ruler", "runner"]
