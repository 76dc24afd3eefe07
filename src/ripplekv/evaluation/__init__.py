"""Evaluation: the suites of ``ripplekv eval`` (LongBench, RULER-style, needle, JSONL), its runner, and the report.

Modules: :mod:`~ripplekv.evaluation.running.config` (options), :mod:`~ripplekv.evaluation.suites` (the suite registry),
:mod:`~ripplekv.evaluation.running.runner` (``run_eval``), :mod:`~ripplekv.evaluation.running.rows` (the rows of one
sample, fidelity included), :mod:`~ripplekv.evaluation.running.results` (``config.json`` and ``results.jsonl``), the
LongBench protocol (:mod:`~ripplekv.evaluation.tasks.longbench`, :mod:`~ripplekv.evaluation.tasks.longbench_config`,
:mod:`~ripplekv.evaluation.tasks.metrics`), the RULER-style tasks (:mod:`~ripplekv.evaluation.tasks.ruler` and its
``ruler_tasks`` / ``ruler_text``) and :mod:`~ripplekv.evaluation.reporting.report`.

Nothing is imported here: import the modules by path (the statistics and the report need no torch).
"""
