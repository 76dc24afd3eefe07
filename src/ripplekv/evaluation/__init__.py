"""Evaluation: the suites of ``ripplekv eval`` (LongBench, RULER-style, needle, JSONL), its runner, and the report.

Four subpackages, each importing only the ones before it (``docs/architecture.md``; ``tests/test_imports.py``):

- :mod:`~ripplekv.evaluation.tasks`: the benchmarks' own protocols (LongBench's data, prompts and metrics, the
  RULER-style generators, JSON lines);
- :mod:`~ripplekv.evaluation.suites`: the suite registry and the suites, which turn them into samples;
- :mod:`~ripplekv.evaluation.running`: options (``running.config``), the rows of one sample (``running.rows``),
  ``run_eval`` (``running.runner``), ``config.json`` and ``results.jsonl`` (``running.results``), Ray;
- :mod:`~ripplekv.evaluation.reporting`: ``ripplekv report``, its statistics, tables and plots (no torch);

and :mod:`~ripplekv.evaluation.sample`, the leaf they all import (``EvalSample``, configuration names).

Nothing is imported here: import the modules by path (the statistics and the report need no torch).
"""
