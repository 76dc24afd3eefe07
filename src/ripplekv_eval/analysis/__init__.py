"""The paper's analysis in the product: per-layer damage and its agreement with a profile.

- :mod:`ripplekv_eval.analysis.damage`: the fidelity loss of compressing one layer alone, every layer from one prefill;
- :mod:`ripplekv_eval.analysis.correlation`: Spearman's rho, its bootstrap interval over prompts, top-k overlap;
- :mod:`ripplekv_eval.analysis.report` and :mod:`ripplekv_eval.analysis.plots`: the summary (JSON, Markdown), plots;
- :mod:`ripplekv_eval.analysis.runner`: ``ripplekv analyze`` (resumable runs over a suite's prompts);
- :mod:`ripplekv_eval.analysis.tuning`: ``ripplekv tune``.

The damage profiles ``ripplekv analyze`` writes are a kind of profile: :mod:`ripplekv.profiling.damage_profile`.
Nothing is imported here; import the modules by path.
"""
