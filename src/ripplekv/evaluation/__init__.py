"""Evaluation protocols and metrics (LongBench v1 / LongBench-E)."""

from ripplekv.evaluation import longbench, metrics

__all__ = ["longbench", "metrics"]
