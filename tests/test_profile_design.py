"""The profile-design fidelity comparison (benchmarks/profile_design_fidelity.py) on synthetic tune rows."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.profile_design_fidelity import SNAPKV, compare, variant_of

KEYS = ("default|r=4|gamma=3", "better|r=4|gamma=3", "same|r=4|gamma=3", "worse|r=4|gamma=3")


def rows(n_tasks: int = 4, per_task: int = 10, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_tasks):
        for i in range(per_task):
            base = float(rng.uniform(0.2, 0.6))
            for budget in (0.1, 0.2):
                kl = {
                    KEYS[0]: base,
                    KEYS[1]: base - 0.05 - float(rng.uniform(0, 0.01)),  # lower on every prompt
                    KEYS[2]: base + float(rng.normal(0, 0.01)),  # noise around the reference
                    KEYS[3]: base + 0.04 + float(rng.uniform(0, 0.01)),
                }
                out.append(
                    {"sample_id": f"t{t}/{i}", "task": f"t{t}", "budget": budget, "kl": kl, "snapkv_kl": base + 0.1}
                )
    return out


def entry(budget: dict, variant: str) -> dict:
    return next(e for e in budget["entries"] if e["variant"] == variant)


def test_verdicts_follow_the_paired_differences() -> None:
    result = compare(rows(), "default", 0)
    assert [b["budget"] for b in result] == [0.1, 0.2]
    for budget in result:
        assert budget["prompts"] == 40
        better, same, worse = entry(budget, "better"), entry(budget, "same"), entry(budget, "worse")
        assert better["beats_reference"] and not better["worse_than_reference"]
        assert better["wins"] == 40 and better["high"] < 0
        assert worse["worse_than_reference"] and not worse["beats_reference"]
        assert not same["beats_reference"] and not same["worse_than_reference"]
        assert better["difference"] == pytest.approx(-0.055, abs=0.003)
        ref = entry(budget, "default")
        assert "difference" not in ref  # the reference is not compared with itself
        snap = entry(budget, SNAPKV)
        assert snap["difference"] == pytest.approx(0.1) and "p_holm" not in snap  # SnapKV is outside the family


def test_holm_adjusts_over_the_variants_only() -> None:
    budget = compare(rows(), "default", 0)[0]
    family = [e for e in budget["entries"] if "p_holm" in e]
    assert {e["variant"] for e in family} == {"better", "same", "worse"}
    for e in family:
        assert e["p_holm"] >= e["p"]
    smallest = min(family, key=lambda e: e["p"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, 3 * smallest["p"]))


def test_unknown_reference_is_refused() -> None:
    with pytest.raises(SystemExit, match="no candidate of profile 'nope'"):
        compare(rows(), "nope", 0)


def test_variant_label_of_a_candidate_key() -> None:
    assert variant_of("evict-qa-b0p1|r=4|gamma=3") == "evict-qa-b0p1"
    assert variant_of(SNAPKV) == SNAPKV
