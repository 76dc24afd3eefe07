"""The paper's analysis in the product: per-layer damage (:mod:`~ripplekv_eval.analysis.damage`), its agreement with
a profile (:mod:`~ripplekv_eval.analysis.correlation`), their summary (``report``, ``plots``), ``ripplekv analyze``
(``runner``) and ``ripplekv tune`` (``tuning``). Nothing is imported here; import the modules by path.
"""
