"""The summary of ``ripplekv tune``: selection on the calibration split, gains on the held-out split.

Per budget: every candidate's macro-mean KL (:mod:`ripplekv_eval.reporting.stats`) on both splits (held-out means are
shown, never used to choose); ``best``, the lowest calibration KL (ties: grid order); and held-out paired comparisons
(sign-flip test, Holm over the budget's four): ``best - default``,
``best - snapkv``, ``default - snapkv`` and ``best - shared``, where ``shared`` has the lowest calibration KL averaged
over the budgets (if ``best - shared`` is never significant, the best allocation does not depend on the budget).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ripplekv_eval.reporting.stats import (
    ALPHA,
    DEFAULT_DRAWS,
    DEFAULT_FAMILY,
    METRICS,
    TEST_NAME,
    Bootstrap,
    Comparison,
    Estimate,
    Samples,
    SignFlip,
    compare,
    paired_differences,
    settle,
)

SNAPKV = "snapkv"


def candidate_samples(rows: Sequence[Mapping[str, Any]], ids: set[str] | None, key: str) -> Samples:
    """task -> prompt id -> KL of candidate ``key`` (``snapkv``: uniform SnapKV) for ``ids`` (None: every row)."""
    out: Samples = {}
    for row in rows:
        if ids is None or str(row["sample_id"]) in ids:
            value = row["snapkv_kl"] if key == SNAPKV else row["kl"][key]
            out.setdefault(str(row["task"]), {})[str(row["sample_id"])] = float(value)
    return out


def macro_mean(samples: Samples) -> float:
    """The mean over tasks of each task's mean."""
    return float(np.mean([np.mean(list(values.values())) for values in samples.values() if values]))


COMPARISONS = ("best_minus_default", "best_minus_snapkv", "default_minus_snapkv", "best_minus_shared")


KL = METRICS["fidelity_kl"]
"""The tuned metric: wins and losses of a held-out comparison are lower and higher KL."""


def comparison_record(c: Comparison, bca: Estimate | None = None) -> dict[str, Any]:
    """A held-out comparison as the summary's JSON: ``a - b``, its interval (None: unbounded), W/T/L, p, the BCa
    interval ``bca`` of the same mean when given (reference only), Holm p."""
    reference = {} if bca is None else {"bca_low": bca.low, "bca_high": bca.high}
    return {
        "difference": c.difference.mean,
        "low": c.difference.low if math.isfinite(c.difference.low) else None,
        "high": c.difference.high if math.isfinite(c.difference.high) else None,
        "wins": c.wins,
        "ties": c.ties,
        "losses": c.losses,
        "p": c.p,
        "test": c.test,
        "sign_vectors": c.vectors,
        "significant": c.significant,
        **reference,
        "p_holm": c.p_holm,
    }


def summarize_tuning(
    rows: Sequence[Mapping[str, Any]],
    candidates: Sequence[str],
    default: str,
    calibration: set[str],
    heldout: set[str],
    resamples: int,
    seed: int,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The tuning summary of ``rows`` (see the module docstring)."""
    if default not in candidates:
        raise ValueError(f"the default {default!r} is not a candidate")
    if calibration & heldout:
        raise ValueError("a prompt cannot be in both splits")
    budgets = sorted({float(r["budget"]) for r in rows})
    if not budgets:
        raise ValueError("no tuning rows to summarise")
    flip = SignFlip(draws=DEFAULT_DRAWS, seed=seed)
    bootstrap = Bootstrap(resamples, seed)
    calibration_kl: dict[float, dict[str, float]] = {}
    per_budget: list[dict[str, Any]] = []
    for budget in budgets:
        at = [r for r in rows if float(r["budget"]) == budget]
        cal_ids = {str(r["sample_id"]) for r in at} & calibration
        held_ids = {str(r["sample_id"]) for r in at} & heldout
        if not cal_ids or not held_ids:
            raise ValueError(f"budget {budget:g}: the calibration or the held-out split has no rows yet")
        calibration_kl[budget] = {key: macro_mean(candidate_samples(at, cal_ids, key)) for key in candidates}
        per_budget.append({"budget": budget, "rows": at, "cal": cal_ids, "held": held_ids})
    shared = min(candidates, key=lambda k: (np.mean([calibration_kl[b][k] for b in budgets]), candidates.index(k)))
    out_budgets = []
    bca: dict[float, dict[str, Estimate]] = {}  # budget -> comparison -> BCa interval of its mean (reference)
    for entry in per_budget:
        budget, at, cal_ids, held_ids = entry["budget"], entry["rows"], entry["cal"], entry["held"]
        best = min(candidates, key=lambda k: (calibration_kl[budget][k], candidates.index(k)))
        held = {key: candidate_samples(at, held_ids, key) for key in (*candidates, SNAPKV)}
        pairs = ((best, default), (best, SNAPKV), (default, SNAPKV), (best, shared))
        tests = compare(KL, [(x, y, held[x], held[y]) for x, y in pairs], flip)
        if None in tests:
            raise ValueError(f"budget {budget:g}: no held-out prompt has both candidates of a comparison")
        diffs = [paired_differences(held[x], held[y]) for x, y in pairs]
        bca[budget] = dict(zip(COMPARISONS, bootstrap.estimates(diffs)))
        out_budgets.append(
            {
                "budget": budget,
                "calibration_prompts": len(cal_ids),
                "heldout_prompts": len(held_ids),
                "best": best,
                "candidates": [
                    {
                        "key": key,
                        "calibration_kl": calibration_kl[budget][key],
                        "heldout_kl": macro_mean(held[key]),
                    }
                    for key in sorted(candidates, key=lambda k: (calibration_kl[budget][k], candidates.index(k)))
                ],
                "snapkv": {
                    "calibration_kl": macro_mean(candidate_samples(at, cal_ids, SNAPKV)),
                    "heldout_kl": macro_mean(held[SNAPKV]),
                },
                "heldout": dict(zip(COMPARISONS, tests)),
            }
        )
    for b in out_budgets:  # Holm over one budget's comparisons
        settled = settle([b["heldout"][name] for name in COMPARISONS], ALPHA)
        b["heldout"] = {name: comparison_record(c, bca[b["budget"]][name]) for name, c in zip(COMPARISONS, settled)}
    depends = any(b["heldout"]["best_minus_shared"]["significant"] for b in out_budgets)
    return {
        "format": "ripplekv-tune/1",
        "context": dict(context or {}),
        "default": default,
        "shared": shared,
        "test": {
            "name": TEST_NAME,
            "draws": DEFAULT_DRAWS,
            "seed": seed,
            "family": DEFAULT_FAMILY,
            "family_description": "the four held-out comparisons of one budget",
            "adjustment": "holm",
            "alpha": ALPHA,
        },
        "budgets": out_budgets,
        "best_depends_on_budget": depends,
    }


def _fmt(c: Mapping[str, Any]) -> str:
    mark = " (significant)" if c["significant"] else ""
    holm_p = f", Holm p={c['p_holm']:.3g}" if "p_holm" in c else ""
    low = "-inf" if c["low"] is None else f"{c['low']:+.4f}"
    high = "+inf" if c["high"] is None else f"{c['high']:+.4f}"
    return (
        f"{c['difference']:+.4f} [{low}, {high}], {c['wins']}/{c['ties']}/{c['losses']}, p={c['p']:.3g}{holm_p}{mark}"
    )


def tuning_markdown(summary: Mapping[str, Any], top: int = 5) -> str:
    """A markdown report of :func:`summarize_tuning`'s summary."""
    ctx = summary.get("context", {})
    lines = [
        f"# ripplekv tune: {ctx.get('model', '?')} on {ctx.get('suite', '?')}",
        "",
        f"Defaults: `{summary['default']}`. One candidate for all budgets (lowest mean calibration KL): "
        f"`{summary['shared']}`. Mean KL(full || method) over the full cache's answer, nats (lower is better); "
        "differences on held-out prompts: mean [95% CI], wins/ties/losses, p and Holm p.",
        "",
    ]
    test = summary.get("test")
    if test is not None:
        lines += [
            f"Test: {test['name']} ({test['draws']} random sign vectors + the identity, seed {test['seed']}); "
            f"Holm over {test['family_description']}; significant = Holm p < {test['alpha']:g}.",
            "",
        ]
    for entry in summary["budgets"]:
        lines += [
            f"## Budget {entry['budget']:g} ({entry['calibration_prompts']} calibration, "
            f"{entry['heldout_prompts']} held-out prompts)",
            "",
            "| candidate | calibration KL | held-out KL |",
            "|---|---:|---:|",
        ]
        for cand in entry["candidates"][:top]:
            mark = " (defaults)" if cand["key"] == summary["default"] else ""
            lines.append(f"| `{cand['key']}`{mark} | {cand['calibration_kl']:.4f} | {cand['heldout_kl']:.4f} |")
        default = next(c for c in entry["candidates"] if c["key"] == summary["default"])
        if default not in entry["candidates"][:top]:
            cal, held = default["calibration_kl"], default["heldout_kl"]
            lines.append(f"| `{default['key']}` (defaults) | {cal:.4f} | {held:.4f} |")
        cal, held = entry["snapkv"]["calibration_kl"], entry["snapkv"]["heldout_kl"]
        lines.append(f"| snapkv (uniform) | {cal:.4f} | {held:.4f} |")
        held = entry["heldout"]
        lines += [
            "",
            f"- best `{entry['best']}` minus defaults: {_fmt(held['best_minus_default'])}",
            f"- best minus snapkv: {_fmt(held['best_minus_snapkv'])}",
            f"- defaults minus snapkv: {_fmt(held['default_minus_snapkv'])}",
            f"- best minus the shared candidate: {_fmt(held['best_minus_shared'])}",
            "",
        ]
    verdict = "depends" if summary["best_depends_on_budget"] else "does not depend (to this run's resolution)"
    lines.append(f"The best allocation {verdict} on the budget.")
    return "\n".join(lines) + "\n"


def methods_markdown(summary: Mapping[str, Any]) -> str:
    """The rivals' part of the tuning report: per method, its shared choice and, per budget, its best candidate's
    held-out gain over its defaults.
    """
    methods = summary.get("methods", {})
    if not methods:
        return ""
    lines = [
        "## Every method's knobs, tuned the same way",
        "",
        "Each method's grid, chosen on the same calibration prompts by the same rule (lowest macro-mean KL), its "
        "best candidate compared with its own defaults on the held-out prompts. Tuned settings (one per method, "
        "the lowest calibration KL averaged over the budgets):",
        "",
    ]
    lines += [f"- `{name}`: `{spec}`" for name, spec in summary.get("settings", {}).items()]
    lines += ["", "| method | budget | best | calibration KL (best / defaults) | held-out best minus defaults |"]
    lines.append("|---|---|---|---|---|")
    for method, entry in methods.items():
        for budget in entry["budgets"]:
            by_key = {c["key"]: c for c in budget["candidates"]}
            best, default = by_key[budget["best"]], by_key[entry["default"]]
            lines.append(
                f"| {method} | {budget['budget']:g} | `{budget['best']}` | {best['calibration_kl']:.4f} / "
                f"{default['calibration_kl']:.4f} | {_fmt(budget['heldout']['best_minus_default'])} |"
            )
    return "\n".join(lines) + "\n"
