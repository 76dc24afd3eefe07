"""Capacity benchmark: full cache, SnapKV-uniform and RippleKV budgets in vLLM at one KV-cache size, side by side.

Runs in the vLLM environment (``benchmarks/serving/install_vllm_env.sh``, then ``benchmarks/serving/test.sh`` to
install the plugin); never in the main one:

    .venv-vllm/bin/python benchmarks/serving.py --budgets 0.1 0.2 0.3 --requests 24 --min-tokens 2048 \
        --max-tokens 3072 --max-new-tokens 256 --max-model-len 3584 --kv-mib 370 \
        --out benchmarks/results/serving-capacity-decode

Every configuration serves the same requests, all submitted at once, from an engine with the same KV-cache memory
(``--kv-mib`` MiB, vLLM's ``kv_cache_memory_bytes``; or ``--kv-gib``) and the same engine settings (block size 32,
no prefix caching, float32, eager, ``max_num_seqs`` the request count so that it never caps the running requests;
without chunked prefill, a step's token budget of one prompt plus every running request's token; with
``--chunked-prefill T``, vLLM's chunked prefill with a step budget of ``T`` tokens, so that an admission no longer
stalls the running requests for a whole prompt), each in a fresh child process:

* ``full``: stock vLLM (``VLLM_PLUGINS=""``), every layer keeps every prompt token;
* ``snapkv-B``: the plugin with one keep fraction, the budget ``B``, in every layer (SnapKV's uniform budget);
* ``ripplekv-B``: the plugin with the profile's per-layer budgets at the same global budget (``--groups``: one
  KV-cache group per layer by default, or tiers).

The workload is meant to hold more requests than fit, so that the most requests running at once measures
capacity rather than the request count, and to be decode-heavy (long outputs). The prompts are BAMBOO documents
(``benchmarks/heldout/bamboo.jsonl``, those of ``--max-tokens`` context tokens or more) cut to token lengths drawn
uniformly from ``[--min-tokens, --max-tokens]`` (seeded), each with its question in the chat template; every request
decodes ``--max-new-tokens`` greedy tokens (``ignore_eos``, so every configuration generates the same number of
tokens). The engine is driven step by step; the child records after every step the KV blocks in use, the requests
running and the step's time (split into steps that prefill a prompt and decode-only steps), and per request the
time to its first token (from submission) and the time per output token after it.

Fidelity (:mod:`ripplekv_vllm.fidelity`): the full cache's run records every output token's distribution (in
``--fidelity-dir``, a temporary folder by default); each compressed run serves the same requests teacher-forced
along the full cache's answers and records KL(full || compressed) per token and its own top token, so each
compressed answer's agreement with the full cache's is measured on the request served under load.

The parent writes ``serving.md``: capacity and latency with the ratios to ``full``, fidelity (mean and p99 KL per
token, top-1 agreement, the share of each answer before its first difference and of answers equal to the full
cache's), the time split, and the block arithmetic of each configuration's concurrency (:func:`ceiling`) beside the
measured one. A child's JSON is written when it finishes, so an interrupted run keeps finished configurations and
re-running skips them (the compressed ones compare with the full cache's run: without ``full.json`` they must go too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
BLOCK = 32
ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "seed": 0,
    "enable_prefix_caching": False,
    "enable_chunked_prefill": False,
    "block_size": BLOCK,
}


def prompts(tokenizer: Any, count: int, low: int, high: int, seed: int) -> list[list[int]]:
    """``count`` chat prompts of BAMBOO documents (those of ``high`` tokens or more) cut to a seeded length in
    ``[low, high]`` tokens of context, each followed by its question."""
    records = [json.loads(line) for line in BAMBOO.read_text().splitlines() if line.strip()]
    contexts = [tokenizer(r["context"], add_special_tokens=False).input_ids for r in records]
    usable = [(r, ids) for r, ids in zip(records, contexts) if len(ids) >= high]  # every draw is served whole
    if not usable:
        raise SystemExit(f"no BAMBOO record has {high} context tokens; lower --max-tokens")
    rng = random.Random(seed)
    out: list[list[int]] = []
    for i in range(count):
        record, ids = usable[i % len(usable)]
        keep = rng.randint(low, high)
        user = tokenizer.decode(ids[:keep]) + "\n\n" + record["question"]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        out.append(tokenizer(text, add_special_tokens=False).input_ids)
    return out


def configs(budgets: list[float]) -> list[str]:
    """The configurations of a run: the full cache, then SnapKV-uniform and RippleKV at each budget."""
    return ["full"] + [f"{method}-{budget:g}" for budget in budgets for method in ("snapkv", "ripplekv")]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear interpolation, numpy's default); NaN for none."""
    return float(np.percentile(values, q)) if values else float("nan")


def step_budget(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's context and step token budget: one whole prompt plus every running request's decode token, or
    with ``--chunked-prefill T`` chunked prefill and ``T`` tokens a step."""
    seqs = args.max_num_seqs or args.requests
    if args.chunked_prefill is None:
        return {"max_model_len": args.max_model_len, "max_num_batched_tokens": args.max_model_len + seqs}
    return {
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.chunked_prefill,
        "enable_chunked_prefill": True,
    }


def child(args: argparse.Namespace) -> None:
    """Serve every request under one configuration and write its measurements to ``OUT/<config>.json``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from ripplekv_vllm.fidelity import TeacherForcing, force_args, read_forced, read_reference, record_args
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # one prompt and every running request's decode token fit in a step; the running count is never capped
    max_num_seqs = args.max_num_seqs or args.requests
    engine = dict(ENGINE, **step_budget(args), max_num_seqs=max_num_seqs, logits_processors=[TeacherForcing])
    if args.kv_mib is not None:
        engine["kv_cache_memory_bytes"] = args.kv_mib * 2**20
    budget = 1.0
    if args.config != "full":
        import ripplekv_vllm

        ripplekv_vllm.register()
        budget = float(args.config.split("-", 1)[1])
        layers = json.loads((Path(args.model_dir) / "config.json").read_text())["num_hidden_layers"]
        settings = plugin_settings(args.config, args, layers)
        engine.update(worker_cls=ripplekv_vllm.WORKER_CLS, additional_config={"ripplekv": settings})
    llm = LLM(model=args.model_dir, **engine)
    ids = prompts(llm.get_tokenizer(), args.requests, args.min_tokens, args.max_tokens, args.seed)
    names = [f"r{i}" for i in range(len(ids))]
    reference = args.fidelity_dir / "full"
    if args.config == "full":  # record the full cache's distribution of every output token
        shutil.rmtree(reference, ignore_errors=True)
        extra = {name: record_args(name, reference) for name in names}
    else:  # teacher-force the full cache's answers and measure KL(full || compressed) per token
        base = json.loads((args.out / "full.json").read_text())
        if base["prompt_lens"] != [len(p) for p in ids]:
            raise SystemExit("the full cache's run served other prompts: delete full.json and run again")
        if not all((reference / f"{name}.npy").exists() for name in names):
            raise SystemExit(f"the full cache's references are missing from {reference}: delete full.json")
        results = args.fidelity_dir / args.config
        shutil.rmtree(results, ignore_errors=True)
        extra = {name: force_args(name, reference, results, base["answers"][name]) for name in names}
    params = {
        name: SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True, extra_args=extra[name])
        for name in names
    }
    engine_core = llm.llm_engine.engine_core.engine_core
    scheduler = engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    usable = pool.num_gpu_blocks - 1  # the null block
    started = time.perf_counter()
    for name, prompt in zip(names, ids):
        llm.llm_engine.add_request(name, TokensPrompt(prompt_token_ids=prompt), params[name])
    used: list[float] = []
    running: list[int] = []
    generated = 0
    preemptions: dict[str, int] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    answers: dict[str, list[int]] = {}
    step_seconds: list[float] = []  # per engine step, and whether it prefilled a prompt (new or resumed)
    prefill_step: list[bool] = []
    stepped: list[int] = []  # requests that got a token in the step
    while llm.llm_engine.has_unfinished_requests():
        computed = {r.request_id: r.num_computed_tokens for r in scheduler.requests.values()}
        tick = time.perf_counter()
        outputs = llm.llm_engine.step()
        step_seconds.append(time.perf_counter() - tick)
        grown = (r.num_computed_tokens - computed.get(r.request_id, 0) for r in scheduler.requests.values())
        prefill_step.append(any(g > 1 for g in grown))
        stepped.append(len(outputs))
        for out in outputs:
            now = time.perf_counter() - started
            if out.outputs[0].token_ids:
                first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = now
                answers[out.request_id] = list(out.outputs[0].token_ids)
                generated += len(out.outputs[0].token_ids)
        used.append((usable - pool.get_num_free_blocks()) / usable)
        running.append(len(scheduler.running))
        for request in scheduler.running:
            preemptions[request.request_id] = max(preemptions.get(request.request_id, 0), request.num_preemptions)
    seconds = time.perf_counter() - started
    ttft = [first[r] for r in answers]
    tpot = [(done[r] - first[r]) / (len(answers[r]) - 1) for r in answers if len(answers[r]) > 1]
    fidelity: dict[str, Any] = {}
    if args.config == "full":
        for name in names:  # row t of each reference is the distribution of output token t
            top = np.asarray(read_reference(reference, name)).argmax(-1).tolist()
            if top != answers[name]:
                raise SystemExit(f"{name}: the recorded distributions' top tokens are not the full cache's answer")
    else:
        for name in names:
            if answers[name] != base["answers"][name]:
                raise SystemExit(f"{name}: the forced answer is not the full cache's")
            kl, top1 = read_forced(results, name)
            if np.isnan(kl).any() or (top1 < 0).any():
                raise SystemExit(f"{name}: a token was produced without its fidelity row")
            same = top1 == np.asarray(answers[name])
            fidelity[name] = {
                "kl": [float(f"{v:.6g}") for v in kl],
                "top1_equal": int(same.sum()),
                "first_difference": int(np.argmin(same)) if not same.all() else len(same),
            }
    result = {
        "config": args.config,
        "budget": budget,
        "requests": len(ids),
        "max_num_seqs": max_num_seqs,
        "max_model_len": args.max_model_len,
        "chunked_prefill": args.chunked_prefill,
        "prompt_tokens": sum(len(p) for p in ids),
        "prompt_lens": [len(p) for p in ids],
        "kv_cache_groups": scheduler.kv_cache_manager.num_kv_cache_groups,
        "generated_tokens": generated,
        "seconds": round(seconds, 3),
        "requests_per_second": len(ids) / seconds,
        "output_tokens_per_second": generated / seconds,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "kv_pool_blocks": usable,
        "kv_cache_gib": int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "0")),
        "kv_cache_mib": args.kv_mib,
        "peak_kv_share": max(used),
        "mean_kv_share": sum(used) / len(used),
        "max_running": max(running),
        "mean_running": sum(running) / len(running),
        "steps": len(used),
        "prefill_steps": sum(prefill_step),
        "prefill_step_seconds": sum(t for t, p in zip(step_seconds, prefill_step) if p),
        "decode_step_seconds": sum(t for t, p in zip(step_seconds, prefill_step) if not p),
        "decode_step_tokens": sum(n for n, p in zip(stepped, prefill_step) if not p),
        "preemptions": sum(preemptions.values()),
        "answers": {name: answers[name] for name in names},
        "fidelity": fidelity,
    }
    (args.out / f"{args.config}.json").write_text(json.dumps(result, indent=1) + "\n")


def fidelity_summary(result: dict[str, Any]) -> dict[str, float]:
    """A compressed configuration's agreement with the full cache, over every request's teacher-forced answer.

    ``answers_equal``: the share of requests whose top token is the full cache's at every position (the greedy
    answer served free-running would be the full cache's); ``answer_prefix_agreement``: the mean share of each answer
    before its first difference (where the free-running answer would part); ``top1_match``: the share of all
    positions whose top token is the full cache's; ``kl_mean`` / ``kl_p99``: KL(full || compressed) per token, the
    mean and 99th percentile over every token of every request.
    """
    rows = result["fidelity"].values()
    kl = [v for row in rows for v in row["kl"]]
    tokens = [len(row["kl"]) for row in rows]
    return {
        "answers_equal": sum(row["first_difference"] == n for row, n in zip(rows, tokens)) / len(tokens),
        "answer_prefix_agreement": sum(row["first_difference"] / n for row, n in zip(rows, tokens)) / len(tokens),
        "top1_match": sum(row["top1_equal"] for row in rows) / sum(tokens),
        "kl_mean": float(np.mean(kl)),
        "kl_p99": percentile(kl, 99),
    }


CAPACITY = (
    ("max_running", "most running at once"),
    ("mean_running", "mean running"),
    ("output_tokens_per_second", "output tokens/s"),
    ("requests_per_second", "requests/s"),
    ("ttft_p50", "TTFT p50 s"),
    ("ttft_p99", "TTFT p99 s"),
    ("tpot_p50", "TPOT p50 s"),
    ("tpot_p99", "TPOT p99 s"),
    ("preemptions", "preemptions"),
    ("peak_kv_share", "peak KV pool in use"),
    ("mean_kv_share", "mean KV pool in use"),
    ("seconds", "wall s"),
)
FIDELITY = (
    ("kl_mean", "KL(full ‖ compressed) per token, mean"),
    ("kl_p99", "KL per token, p99"),
    ("top1_match", "top-1 = full's token (teacher-forced)"),
    ("answer_prefix_agreement", "answer before first difference"),
    ("answers_equal", "answers equal to full"),
)


def table(results: list[dict[str, Any]], timing: list[dict[str, Any]] | None = None) -> str:
    """Capacity and latency with their ratios to the full cache's, then fidelity, then the step time split, as
    markdown (``timing``: further runs with the split, such as a configuration measured again for it)."""
    base = next(r for r in results if r["config"] == "full")
    lines = [
        "| config | budget | " + " | ".join(label for _, label in CAPACITY) + " |",
        "|---|---|" + "---|" * len(CAPACITY),
    ]
    for r in results:
        cells = []
        for key, _ in CAPACITY:
            value = r[key]
            shown = f"{value:.1%}" if "share" in key else f"{value:.3g}"
            if r is base or not base[key]:
                cells.append(shown)  # a ratio to zero (no preemption under the full cache) is left out
            else:
                cells.append(f"{shown} ({value / base[key]:.2f}x)")
        lines.append(f"| {r['config']} | {r['budget']:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| config | budget | " + " | ".join(label for _, label in FIDELITY) + " |",
        "|---|---|" + "---|" * len(FIDELITY),
    ]
    for r in results:
        if r is base:
            continue
        summary = fidelity_summary(r)
        cells = [f"{summary[k]:.1%}" if "kl" not in k else f"{summary[k]:.3g}" for k, _ in FIDELITY]
        lines.append(f"| {r['config']} | {r['budget']:g} | " + " | ".join(cells) + " |")
    timed = [r for r in [*results, *(timing or [])] if "prefill_steps" in r]
    if timed:
        lines += [
            "",
            "| config | budget | steps | prefill steps | prefill-step s | decode-only-step s | tokens in decode-only "
            "steps | their tokens/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in timed:
            rate = r["decode_step_tokens"] / r["decode_step_seconds"]
            cells = [r["steps"], r["prefill_steps"], f"{r['prefill_step_seconds']:.0f}"]
            cells += [f"{r['decode_step_seconds']:.0f}", r["decode_step_tokens"], f"{rate:.3g}"]
            lines.append(f"| {r['config']} | {r['budget']:g} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plugin_settings(config: str, args: argparse.Namespace, layers: int) -> dict[str, Any]:
    """``additional_config["ripplekv"]`` of a compressed configuration (``snapkv-B``, ``ripplekv-B``)."""
    method, budget_text = config.split("-", 1)
    if method == "snapkv":
        return {"keep_fractions": [float(budget_text)] * layers}
    return {"profile": str(args.profile), "budget": float(budget_text), "groups": args.groups}


def layer_budgets(config: str, args: argparse.Namespace, layers: int) -> Any:
    """Every group's kept prompt blocks under ``config`` (keeping everything for the full cache), as the plugin
    resolves them (a :class:`ripplekv_vllm.budgets.GroupBudgets`)."""
    from ripplekv_vllm.budgets import FractionBudgets
    from ripplekv_vllm.config import RippleConfig

    if config == "full":
        return FractionBudgets.of_layers([1.0] * layers, BLOCK, 64)
    engine = step_budget(args)
    settings = plugin_settings(config, args, layers)
    return RippleConfig.from_settings(settings, num_layers=layers, block_size=BLOCK, **engine).budgets


def footprint(prompt: int, generated: int, budgets: Any) -> float:
    """KV blocks a request holds once it has generated ``generated`` tokens (its prompt compacted), in blocks of
    every layer: each group's compacted blocks ``k / bs`` plus the blocks from the prompt's tail on, averaged over
    the groups (of equal sizes)."""
    tokens = prompt + generated  # the slots of the step that computes the next token
    blocks = []
    for group in range(len(budgets.groups)):
        kept, full = budgets.hole(prompt, group)
        blocks.append(kept // BLOCK + -(-(tokens - full) // BLOCK))
    return sum(blocks) / len(blocks)


def ceiling(result: dict[str, Any], budgets: Any, new_tokens: int) -> dict[str, float]:
    """The concurrency the block arithmetic allows a configuration, from its prompts and pool (means over prompts).

    A waiting request is admitted only when its whole uncompressed prompt's blocks ``F`` are free (its prefill
    writes every prompt token before the hole is freed), so with ``n - 1`` compacted requests of ``c`` blocks
    running, ``n`` run at once when ``(n - 1) c + F <= pool``: ``admit_start`` is ``(pool - F) / c + 1`` for requests
    just prefilled, ``admit_half`` the same for requests halfway through their answers, and ``hold_end`` the pool over
    the footprint of requests at their last token (the running set the pool holds without preemption).
    """
    lens, pool = result["prompt_lens"], result["kv_pool_blocks"] / result["kv_cache_groups"]

    def mean(generated: int) -> float:
        return sum(footprint(n, generated, budgets) for n in lens) / len(lens)

    prompt = sum(-(-n // BLOCK) for n in lens) / len(lens)
    start, half, end = mean(1), mean(new_tokens // 2), mean(new_tokens)
    return {
        "pool_blocks": pool,
        "prompt_blocks": prompt,
        "blocks_start": start,
        "blocks_end": end,
        "admit_start": (pool - prompt) / start + 1,
        "admit_half": (pool - prompt) / half + 1,
        "hold_end": pool / end,
    }


def ceiling_table(results: list[dict[str, Any]], args: argparse.Namespace, layers: int) -> str:
    """The block arithmetic of every configuration beside its measured concurrency, as markdown."""
    rows = {r["config"]: ceiling(r, layer_budgets(r["config"], args, layers), args.max_new_tokens) for r in results}
    full = rows["full"]
    base = next(r for r in results if r["config"] == "full")
    lines = [
        (
            "| config | pool blocks | prompt blocks (mean) | blocks after prefill (mean) | blocks at the last token "
            "(mean) | admitted, fresh requests | admitted, half-grown requests | held at the last token | measured "
            "most running | 1 / budget x full's measured |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = rows[r["config"]]
        cells = [f"{row[k]:.1f}" for k in ("pool_blocks", "prompt_blocks", "blocks_start", "blocks_end")]
        for key in ("admit_start", "admit_half", "hold_end"):
            cells.append(f"{row[key]:.1f}" + ("" if r["config"] == "full" else f" ({row[key] / full[key]:.2f}x)"))
        cells.append(f"{r['max_running']} ({r['max_running'] / base['max_running']:.2f}x)")
        cells.append(f"{base['max_running'] / r['budget']:.1f}")
        lines.append(f"| {r['config']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None, help="HF directory (default: the library's SmolLM2 conversion)")
    parser.add_argument("--profile", type=Path, default=ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.2, 0.3], help="global kept fractions")
    parser.add_argument("--budget", type=float, default=None, help="one budget (the same as --budgets BUDGET)")
    parser.add_argument(
        "--groups", type=lambda v: v if v == "layer" else int(v), default="layer", help="'layer' or a tier count"
    )
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--min-tokens", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=3900)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE of every configuration")
    parser.add_argument("--kv-mib", type=int, default=None, help="KV-cache MiB of every configuration (over --kv-gib)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="vLLM's max_num_seqs (default: --requests)")
    parser.add_argument(
        "--fidelity-dir",
        type=Path,
        default=None,
        help="where the full cache's per-token distributions go (default: a temporary folder named after --out)",
    )
    parser.add_argument(
        "--chunked-prefill", type=int, default=None, help="serve with chunked prefill, this many tokens a step"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    if args.budget is not None:
        args.budgets = [args.budget]
    for budget in args.budgets:
        if not 0.0 < budget <= 1.0:
            parser.error(f"--budgets: {budget} is not a kept fraction in (0, 1]")
    if args.model_dir is None:
        from ripplekv.models.sources import smollm2_gguf_path

        args.model_dir = str(
            json.loads((ROOT / "benchmarks/results/vllm-probe/reference.json").read_text())["model_dir"]
        )
        if not Path(args.model_dir).is_dir():
            raise SystemExit(f"{args.model_dir} is missing: convert {smollm2_gguf_path()} with the main environment")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fidelity_dir is None:
        args.fidelity_dir = Path(tempfile.gettempdir()) / "ripplekv-serving-fidelity" / args.out.resolve().name
    if args.config is not None:
        child(args)
        return
    names = configs(args.budgets)
    stale = [c for c in names[1:] if (args.out / f"{c}.json").exists()]
    if stale and not (args.out / "full.json").exists():
        raise SystemExit(f"{stale} compare with a full cache's run that full.json no longer holds: delete them too")
    for config in names:
        if (args.out / f"{config}.json").exists():
            continue
        env = dict(os.environ)
        if args.kv_mib is None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_gib)
        else:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if config == "full":
            env["VLLM_PLUGINS"] = ""
        command = [sys.executable, __file__, *sys.argv[1:], "--config", config, "--model-dir", args.model_dir]
        command += ["--fidelity-dir", str(args.fidelity_dir)]
        subprocess.run(command, env=env, check=True)
    results = [json.loads((args.out / f"{c}.json").read_text()) for c in names]
    layers = json.loads((Path(args.model_dir) / "config.json").read_text())["num_hidden_layers"]
    timing = []
    if (args.out / "full-timing.json").exists():  # the full cache measured again for its time split (COMMAND.sh)
        timing.append({**json.loads((args.out / "full-timing.json").read_text()), "config": "full (again)"})
    text = table(results, timing) + "\n" + ceiling_table(results, args, layers)
    (args.out / "serving.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
