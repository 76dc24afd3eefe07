"""What serving granularity costs: the library's fidelity to the full cache with the per-layer budgets each vLLM
serving design would give, on the same prompts (issue 43, item 1).

Run in the main environment (transformers 5.2 + kvpress):

    python benchmarks/serving/granularity.py --model smollm2-135m --out benchmarks/results/serving-granularity/smollm2

For each held-out BAMBOO prompt (``benchmarks/heldout/bamboo.jsonl``, the first ``--per-task`` records of each task,
built as the harness's jsonl suite builds them: question-aware, chat template) the full cache's greedy answer of the
committed held-out run (``--heldout-run``; at most 64 tokens) is teacher-forced over SnapKV-selected caches
(kvpress's ``SnapKVPress``, window 64, kernel 5, through the library's ``LayerBudgetPress``) whose per-layer budgets
are those of each design, at each budget:

* ``library-uniform`` / ``library-ripplekv``: the library's own budgets (SnapKV's ``int(N b)`` per layer; RippleKV's
  ``ProfileSchedule`` at the prompt's length N);
* ``served-uniform``: SnapKV-uniform as the plugin keeps it (one group, ``k + N - T`` tokens, block-rounded);
* ``served-layer``: the plugin's default, one group per layer at the prompt's own length
  (:class:`ripplekv_vllm.budgets.ProfileBudgets`);
* ``served-tiers-G``: G tiers of equal layer counts, each its layers' mean budget at the prompt's own length;
* ``served-tiers-3-ref``: the plugin before this issue: 3 tiers whose kept fractions are computed once at the
  reference length ``--reference-tokens`` (the capacity run's ``max_model_len``, 3,584) for every prompt.

``library-uniform`` and ``library-ripplekv`` recompute the committed held-out run's ``snapkv`` and ``ripplekv`` rows
(``check.md`` gives the largest difference).

Per prompt, budget and design: KL(full || design) per token (mean over the answer) and top-1 agreement, and the
per-layer kept counts. The first ``--all-designs-prompts`` prompts (24) are measured under every design (the
granularity table); the others under ``--core-designs`` only (for ``library_vs_served.py``). Rows go to
``rows.jsonl`` as each prompt finishes (a rerun resumes); ``table.md`` gives, over the prompts measured under every
design, the mean KL per design and budget, each design's KL advantage over its uniform counterpart, and the paired
sign-flip test (``ripplekv_eval.reporting.stats``) of each served design against ``served-uniform``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kvpress import SnapKVPress

from ripplekv.allocation.budget import BudgetSchedule
from ripplekv.inference.generate import Prefill
from ripplekv.models import load_model
from ripplekv.presses import LayerBudgetPress
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.fastpath.batched import batched_teacher_forced_logprobs
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import fidelity
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.suites import load_jsonl, prompt_ids

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "serving" / "src"))  # ripplekv_vllm.budgets / .hole: no vLLM import

from ripplekv_vllm.budgets import FractionBudgets, ProfileBudgets, layer_groups, tier_groups  # noqa: E402
from ripplekv_vllm.hole import hole  # noqa: E402

BLOCK, WINDOW, KERNEL = 32, 64, 5


def heldout_prompts(args: argparse.Namespace, tokenizer: Any) -> list[tuple[str, list[int], list[int]]]:
    """``(sample id, prompt ids, full-cache answer)`` of the first ``--per-task`` records of each task of the held-out
    BAMBOO file, as the harness's jsonl suite builds them (question-aware, chat template), with the full cache's
    answer from the committed held-out run (``--heldout-run``'s ``results.jsonl``), checked against its prompt length.
    """
    committed = {}
    for line in (args.heldout_run / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["method"] == "full":
            committed[row["sample_id"]] = row
    taken: dict[str, int] = {}
    out = []
    for record in load_jsonl(args.data):
        if taken.get(record.task or "", 0) >= args.per_task:
            continue
        taken[record.task or ""] = taken.get(record.task or "", 0) + 1
        ids, _ = prompt_ids(tokenizer, record.context, record.question, "auto")
        sample = f"{record.task}/{record.id}"
        row = committed[sample]
        if row["prompt_tokens"] != len(ids):
            raise SystemExit(f"{sample}: {len(ids)} prompt tokens here, {row['prompt_tokens']} in the committed run")
        out.append((sample, list(ids), list(row["answer_ids"])))
    # interleave the tasks, so that the first prompts (every design) hold both
    by_task: dict[str, list[tuple[str, list[int], list[int]]]] = {}
    for item in out:
        by_task.setdefault(item[0].split("/")[0], []).append(item)
    return [item for group in zip(*by_task.values()) for item in group]


@dataclass(frozen=True)
class Given(BudgetSchedule):
    """The per-layer budgets one design gives a prompt of ``prompt_tokens`` tokens."""

    budgets: tuple[int, ...] = ()
    prompt_tokens: int = 0
    budget: float | None = None
    tokens: int | None = None

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        if prompt_tokens != self.prompt_tokens or n_layers != len(self.budgets):
            raise ValueError(f"budgets for {self.prompt_tokens} tokens and {len(self.budgets)} layers")
        return self.budgets


def setting(text: str) -> tuple[float, float]:
    """``R,G`` as ``(r, gamma)``."""
    ratio, gamma = (float(v) for v in text.split(","))
    return ratio, gamma


def tiers_of(layers: int) -> list[int]:
    """Every tier count that divides the layers into equal groups of at least 2 (one per layer is served-layer)."""
    return [t for t in range(1, layers) if layers % t == 0 and t > 1]


def designs(scores: tuple[float, ...], budget: float, n: int, args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """Each design's per-layer budgets for a prompt of ``n`` tokens (``--designs``: their name prefixes; every
    RippleKV design once per ``--settings`` entry, suffixed ``@rR,gG`` unless it is the default r 4, gamma 3)."""
    layers = len(scores)
    uniform = FractionBudgets((tuple(range(layers)),), (budget,), BLOCK, WINDOW)
    out = {
        "library-uniform": (min(max(int(n * budget), min(WINDOW, n)), n),) * layers,
        "served-uniform": uniform.layer_budgets(n),
    }
    tail = n % BLOCK
    for ratio, gamma in args.settings:
        tag = "" if (ratio, gamma) == (4.0, 3.0) else f"@r{ratio:g},g{gamma:g}"
        per_layer = ProfileBudgets(layer_groups(layers), scores, budget, ratio, gamma, BLOCK, WINDOW)
        out[f"library-ripplekv{tag}"] = per_layer.library_budgets(n)
        out[f"served-layer{tag}"] = per_layer.layer_budgets(n)
        ranking = per_layer.library_budgets(args.reference_tokens)
        order = sorted(range(layers), key=lambda i: (scores[i], i))  # as the plugin ranks its tiers
        for tiers in args.tiers if args.tiers is not None else tiers_of(layers):
            groups = tier_groups(order, tiers)
            served = ProfileBudgets(groups, scores, budget, ratio, gamma, BLOCK, WINDOW)
            out[f"served-tiers-{tiers}{tag}"] = served.layer_budgets(n)
            if tiers not in args.reference_tiers:
                continue
            fractions = [0.0] * layers  # the plugin before issue 43: the tiers' mean fraction at the reference length
            for members in groups:
                mean = sum(ranking[i] for i in members) / len(members) / args.reference_tokens
                for i in members:
                    fractions[i] = min(mean, 1.0)
            out[f"served-tiers-{tiers}-ref{tag}"] = tuple(hole(n, f, BLOCK, WINDOW)[0] + tail for f in fractions)
    return out


def run_prompt(
    model: Any, index: int, ids: list[int], answer: list[int], scores: tuple[float, ...], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every (budget, design) row of one prompt."""
    input_ids = torch.tensor([ids])
    record = record_prefill(model, input_ids, hidden_tail=WINDOW + 1)
    full = Prefill(record.full_cache(), record.next_logits, record.prompt_tokens, record.seconds)
    states, keys, kept = [], [], []
    for budget in args.budgets:
        for name, budgets in designs(scores, budget, len(ids), args).items():
            if index >= args.all_designs_prompts and name.partition("@")[0] not in args.core_designs:
                continue
            press = LayerBudgetPress(
                press=SnapKVPress(window_size=WINDOW, kernel_size=KERNEL), schedule=Given(budgets, len(ids))
            )
            state, _ = derived_prefill(record, press)
            states.append(state)
            keys.append((budget, name))
            kept.append(list(budgets))
    reference = batched_teacher_forced_logprobs(model, [full], answer)[0]
    candidates = batched_teacher_forced_logprobs(model, states, answer, args.rows)
    rows = []
    for (budget, name), budgets, logprobs in zip(keys, kept, candidates):
        result = fidelity(reference, logprobs, answer)
        rows.append({"budget": budget, "design": name, "kl": result.kl, "top1": result.top1, "kept": budgets})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", type=Path, default=ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json")
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "heldout" / "bamboo.jsonl")
    parser.add_argument("--heldout-run", type=Path, default=ROOT / "benchmarks" / "results" / "heldout-bamboo")
    parser.add_argument("--per-task", type=int, default=24, help="records of each task (the first ones)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--reference-tokens", type=int, default=3584)
    parser.add_argument("--rows", type=int, default=8, help="caches teacher-forced in one batch")
    parser.add_argument(
        "--settings", type=setting, nargs="+", default=[(4.0, 3.0)], help="RippleKV r,gamma pairs (default 4,3)"
    )
    parser.add_argument("--tiers", type=int, nargs="*", default=None, help="tier counts (default: every divisor)")
    parser.add_argument("--reference-tiers", type=int, nargs="*", default=[3], help="tiers also at the reference")
    parser.add_argument(
        "--all-designs-prompts", type=int, default=24, help="prompts (the first ones) measured under every design"
    )
    parser.add_argument(
        "--core-designs",
        nargs="+",
        default=["library-uniform", "library-ripplekv", "served-uniform", "served-layer", "served-tiers-6"],
        help="the designs of the remaining prompts (library vs served)",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table-only", action="store_true", help="write the tables from rows.jsonl and stop")
    args = parser.parse_args()
    if args.table_only:
        write_table(args.out, args.out / "rows.jsonl", args)
        return
    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    scores = SensitivityProfile.load(args.profile).scores
    prompts = heldout_prompts(args, tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "answers.jsonl").open("w") as handle:  # the served side forces the same answers
        for index, (sample, ids, answer) in enumerate(prompts):
            handle.write(json.dumps({"prompt": index, "sample_id": sample, "prompt_ids": ids, "answer": answer}) + "\n")
    rows_path = args.out / "rows.jsonl"
    done = {json.loads(line)["prompt"] for line in rows_path.read_text().splitlines()} if rows_path.exists() else set()
    for index, (sample, ids, answer) in enumerate(prompts):
        if index in done:
            continue
        tick = time.perf_counter()
        rows = run_prompt(model, index, ids, answer, scores, args)
        with rows_path.open("a") as handle:
            for row in rows:
                handle.write(
                    json.dumps({"prompt": index, "sample_id": sample, "prompt_tokens": len(ids), **row}) + "\n"
                )
        print(f"prompt {index}: {len(ids)} tokens, {len(rows)} rows, {time.perf_counter() - tick:.1f} s", flush=True)
    write_table(args.out, rows_path, args)


def write_table(out: Path, rows_path: Path, args: argparse.Namespace) -> None:
    """``table.md``: mean KL and top-1 per design and budget, the advantage over uniform, and paired tests."""
    from ripplekv_eval.reporting.stats import SignFlip

    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    every = {r["prompt"] for r in rows if r["prompt"] < args.all_designs_prompts}
    rows = [r for r in rows if r["prompt"] in every]  # the prompts measured under every design
    table: dict[tuple[float, str], dict[int, dict[str, Any]]] = {}
    for row in rows:
        table.setdefault((row["budget"], row["design"]), {})[row["prompt"]] = row
    names = list(dict.fromkeys(row["design"] for row in rows))
    lines = [
        f"# Serving granularity: {args.model}, {len({r['prompt'] for r in rows})} BAMBOO prompts",
        "",
        "Mean KL(full || design) per token over the full cache's 64-token greedy answer; 'advantage kept': the "
        "design's KL advantage over served-uniform as a share of the library's (library-uniform - library-ripplekv); "
        "'vs served-uniform': paired difference (design - served-uniform) with the sign-flip test's 95% CI and p; "
        "'off the library': the mean over prompts of |KL(design) - KL(library's own RippleKV)|, relative to the "
        "library's mean KL (how far the design's answers stray from what the library computes for the same prompt).",
        "",
        "| budget | design | mean KL | top-1 | advantage kept | vs served-uniform [95% CI] | p | W/T/L "
        "| off the library |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for budget in args.budgets:
        base = table[(budget, "served-uniform")]
        for name in names:
            tag = name.partition("@")[2]
            library = table[(budget, "library-ripplekv" + (f"@{tag}" if tag else ""))]
            library_gain = np.mean([table[(budget, "library-uniform")][p]["kl"] - library[p]["kl"] for p in base])
            cells = table[(budget, name)]
            prompts = sorted(set(cells) & set(base))
            kl = np.mean([cells[p]["kl"] for p in prompts])
            top1 = np.mean([cells[p]["top1"] for p in prompts])
            gain = np.mean([base[p]["kl"] - cells[p]["kl"] for p in prompts])
            diffs = [cells[p]["kl"] - base[p]["kl"] for p in prompts]
            if name.startswith("library") or name == "served-uniform":
                test = "", "", ""
            else:
                (result,) = SignFlip().test([{"bamboo": {str(p): d for p, d in zip(prompts, diffs)}}])
                wins = sum(d < 0 for d in diffs), sum(d == 0 for d in diffs), sum(d > 0 for d in diffs)
                test = (
                    f"{result.mean:+.4f} [{result.low:+.4f}, {result.high:+.4f}]",
                    f"{result.p:.3g}",
                    "/".join(map(str, wins)),
                )
            kept = f"{gain / library_gain:.0%}" if name not in ("served-uniform", "library-uniform") else ""
            reference = np.mean([library[p]["kl"] for p in prompts])
            off = np.mean([abs(cells[p]["kl"] - library[p]["kl"]) for p in prompts]) / reference
            lines.append(
                f"| {budget:g} | {name} | {kl:.4f} | {top1:.3f} | {kept} | {test[0]} | {test[1]} | {test[2]} | "
                f"{off:.0%} |"
            )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    write_check(out, rows_path, args)


def write_check(out: Path, rows_path: Path, args: argparse.Namespace) -> None:
    """``check.md``: the library's own rows against the committed held-out run's (the same prompts and answers)."""
    committed: dict[tuple[str, str, float], float] = {}
    for line in (args.heldout_run / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["method"] != "full":
            committed[(row["sample_id"], row["method"], float(row["budget"]))] = row["fidelity_kl"]
    methods = {"library-uniform": "snapkv"}
    for ratio, gamma in args.settings:
        default = (ratio, gamma) == (4.0, 3.0)
        tag = "" if default else f"@r{ratio:g},g{gamma:g}"
        methods[f"library-ripplekv{tag}"] = "ripplekv" if default else f"ripplekv:r={ratio:g},gamma={gamma:g}"
    lines = ["| design | committed method | rows compared | largest difference in KL |", "|---|---|---|---|"]
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    for design, method in methods.items():
        pairs = [
            (r["kl"], committed[(r["sample_id"], method, float(r["budget"]))])
            for r in rows
            if r["design"] == design and (r["sample_id"], method, float(r["budget"])) in committed
        ]
        worst = max((abs(a - b) for a, b in pairs), default=float("nan"))
        lines.append(f"| {design} | {method} | {len(pairs)} | {worst:.3g} |")
    (out / "check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
