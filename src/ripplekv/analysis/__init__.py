"""The paper's analysis in the product: per-layer damage and its agreement with a profile.

- :mod:`ripplekv.analysis.damage`: the fidelity loss of compressing one layer alone, every layer from one prefill;
- :mod:`ripplekv.analysis.correlation`: Spearman's rho, its bootstrap interval over prompts, top-k overlap;
- :mod:`ripplekv.analysis.report` and :mod:`ripplekv.analysis.plots`: the summary (JSON, Markdown) and its plots;
- :mod:`ripplekv.analysis.runner`: ``ripplekv analyze`` (resumable runs over a suite's prompts);
- :mod:`ripplekv.analysis.tuning`: ``ripplekv tune``.

The damage profiles ``ripplekv analyze`` writes are a kind of profile: :mod:`ripplekv.profiling.damage_profile`.
Nothing is imported here; import the modules by path.
"""
