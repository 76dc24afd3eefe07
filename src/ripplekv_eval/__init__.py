"""RippleKV's evaluation harness (``pip install 'ripplekv[eval]'``), beside the library it evaluates.

Layers, each importing only those before it and the library (``docs/architecture.md``; ``tests/test_imports.py``):

- :mod:`~ripplekv_eval.sample`: the leaf they all import (``EvalSample``, configuration names);
- :mod:`~ripplekv_eval.tasks`: the benchmarks' own protocols (LongBench's data, prompts and metrics, the
  RULER-style generators, JSON lines);
- :mod:`~ripplekv_eval.suites`: the suite registry and the suites, which turn them into samples;
- :mod:`~ripplekv_eval.fastpath`: one prefill per prompt recorded, every configuration's cache derived from it;
- :mod:`~ripplekv_eval.running`: options, the rows of one sample, ``run_eval``, the resumable results log, Ray;
- :mod:`~ripplekv_eval.reporting`: ``ripplekv report``, its statistics, tables and plots (no torch);
- :mod:`~ripplekv_eval.analysis`: per-layer damage, rank correlations, tuning;
- :mod:`~ripplekv_eval.cli`: ``ripplekv eval``, ``report``, ``analyze`` and ``tune`` (entry points).

Nothing is imported here: import the modules by path.
"""
