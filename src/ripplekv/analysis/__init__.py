"""The paper's analysis in the product: per-layer damage, its agreement with a profile, oracle (damage) profiles.

- :mod:`ripplekv.analysis.damage`: the fidelity loss of compressing one layer alone, every layer from one prefill;
- :mod:`ripplekv.analysis.correlation`: Spearman's rho, its bootstrap interval over prompts, top-k overlap;
- :mod:`ripplekv.analysis.report` and :mod:`ripplekv.analysis.plots`: the summary (JSON, Markdown) and its plots;
- :mod:`ripplekv.analysis.runner`: ``ripplekv analyze`` (resumable runs over a suite's prompts);
- :mod:`ripplekv.analysis.oracle`: damage profiles and the ``ripplekv-oracle`` method's profile selection.

Only :mod:`~ripplekv.analysis.oracle` is imported here (the press registry needs it); import the others by path.
"""

from ripplekv.analysis.oracle import (
    DAMAGE_KIND,
    ORACLE_METHOD,
    damage_budget,
    is_damage_profile,
    make_damage_profile,
    require_damage_profile,
    select_oracle_profile,
)

__all__ = [
    "DAMAGE_KIND",
    "ORACLE_METHOD",
    "damage_budget",
    "is_damage_profile",
    "make_damage_profile",
    "require_damage_profile",
    "select_oracle_profile",
]
