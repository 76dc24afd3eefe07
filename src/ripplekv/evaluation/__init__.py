"""Evaluation: the suites of ``ripplekv eval`` (LongBench, RULER-style, needle, JSONL), its runner, and the report.

Modules: :mod:`~ripplekv.evaluation.config` (options), :mod:`~ripplekv.evaluation.suites` (the suite registry),
:mod:`~ripplekv.evaluation.runner` (``run_eval``), :mod:`~ripplekv.evaluation.rows` (the rows of one sample, fidelity
included), :mod:`~ripplekv.evaluation.results` (``config.json`` and ``results.jsonl``), the LongBench protocol
(:mod:`~ripplekv.evaluation.longbench`, :mod:`~ripplekv.evaluation.longbench_config`,
:mod:`~ripplekv.evaluation.metrics`), the RULER-style tasks (:mod:`~ripplekv.evaluation.ruler` and its
``ruler_tasks`` / ``ruler_text``) and :mod:`~ripplekv.evaluation.report`.

Nothing is imported here: import the modules by path (the statistics and the report need no torch).
"""
