"""Where a decode step's time goes under the RippleKV vLLM plugin: SnapKV-uniform against RippleKV's per-layer budgets
(and tiers), side by side in one process, and a cProfile of each one's decode steps.

Run in the vLLM environment:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/decode_profile.py --out DIR

Each configuration serves the same ``--requests`` BAMBOO prompts of ``--tokens`` context tokens, all submitted at
once, ``--max-new-tokens`` greedy tokens each (``ignore_eos``), in its own in-process engine; the engines are stepped
in turn, one step each, so that the machine's other load slows them alike. The steps after every prompt is
prefilled are the decode-only steps, timed one by one (the ratio is of the medians) and profiled. ``DIR/
decode_profile.json`` holds the times and each profile's top functions by cumulative and own time;
``DIR/decode_profile.txt`` a summary.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: vLLM's CPU worker otherwise reserves most of it

ROOT = Path(__file__).resolve().parents[2]
BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"


def settings_of(config: str, budget: float, layers: int, profile: Path) -> dict[str, Any] | None:
    """The plugin's settings of a configuration name: ``full``, ``snapkv``, ``ripplekv-layer``, ``ripplekv-tiers-N``."""
    if config == "full":
        return None
    if config == "snapkv":
        return {"keep_fractions": [budget] * layers}
    groups: str | int = "layer" if config == "ripplekv-layer" else int(config.rsplit("-", 1)[1])
    return {"profile": str(profile), "budget": budget, "groups": groups}


def top(profiler: cProfile.Profile, key: str, count: int) -> list[str]:
    """The ``count`` top lines of a profile sorted by ``key``."""
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats(key).print_stats(count)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-count:]


def engine(model_dir: str, config: str, args: argparse.Namespace, prompts: list[list[int]]) -> Any:
    """An in-process engine serving ``config`` with every prompt submitted."""
    import ripplekv_vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    layers = json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]
    settings = settings_of(config, args.budget, layers, args.profile)
    options: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "seed": 0,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "block_size": 32,
        "max_model_len": args.tokens + 64 + args.max_new_tokens,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": len(prompts),
    }
    if settings is not None:
        ripplekv_vllm.register()
        options.update(worker_cls=ripplekv_vllm.WORKER_CLS, additional_config={"ripplekv": settings})
    llm = LLM(model=model_dir, **options)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        llm.llm_engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=ids), params)
    return llm


def serve_side_by_side(model_dir: str, args: argparse.Namespace, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Every configuration's engine stepped in turn (one step each, round robin), so that whatever else the machine
    does slows them alike; each one's decode-only steps timed and profiled."""
    engines = {config: engine(model_dir, config, args, prompts) for config in args.configs}
    times: dict[str, list[float]] = {config: [] for config in engines}
    profilers = {config: cProfile.Profile() for config in engines}
    while any(llm.llm_engine.has_unfinished_requests() for llm in engines.values()):
        for config, llm in engines.items():
            if not llm.llm_engine.has_unfinished_requests():
                continue
            scheduler = llm.llm_engine.engine_core.engine_core.scheduler
            decoding = not scheduler.waiting and all(
                r.num_computed_tokens >= r.num_prompt_tokens for r in scheduler.running
            )
            tick = time.perf_counter()
            if decoding:
                profilers[config].enable()
            llm.llm_engine.step()
            if decoding:
                profilers[config].disable()
                times[config].append(time.perf_counter() - tick)
    results = []
    for config, llm in engines.items():
        llm.llm_engine.engine_core.shutdown()
        steps = times[config]
        results.append(
            {
                "config": config,
                "decode_steps": len(steps),
                "median_step_s": statistics.median(steps),
                "mean_step_s": statistics.fmean(steps),
                "tokens_per_s": len(prompts) * len(steps) / sum(steps),
                "median_tokens_per_s": len(prompts) / statistics.median(steps),
                "top_cumulative": top(profilers[config], "cumulative", 60),
                "top_own": top(profilers[config], "tottime", 30),
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None, help="HF directory (default: benchmarks/results/vllm-probe's)")
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--configs", nargs="+", default=["snapkv", "ripplekv-layer", "ripplekv-tiers-3"])
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model_dir = (
        args.model_dir or json.loads((ROOT / "benchmarks/results/vllm-probe/reference.json").read_text())["model_dir"]
    )
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    records = [json.loads(line) for line in BAMBOO.read_text().splitlines() if line.strip()]
    contexts = [tokenizer.encode(r["context"], add_special_tokens=False).ids for r in records]
    prompts = [ids[: args.tokens] for ids in contexts if len(ids) >= args.tokens][: args.requests]
    results = serve_side_by_side(model_dir, args, prompts)
    base = results[0]["median_tokens_per_s"]
    lines = [f"{len(prompts)} requests of {args.tokens} tokens, {args.max_new_tokens} new tokens, budget {args.budget}"]
    for r in results:
        lines.append(
            f"{r['config']:>18}: {r['decode_steps']} decode-only steps, median {1e3 * r['median_step_s']:.1f} ms: "
            f"{r['median_tokens_per_s']:.1f} tokens/s ({r['median_tokens_per_s'] / base:.3f}x {results[0]['config']}); "
            f"mean {r['tokens_per_s']:.1f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_profile.json").write_text(
        json.dumps(
            {"args": vars(args) | {"out": str(args.out), "profile": str(args.profile)}, "results": results}, indent=1
        )
        + "\n"
    )
    (args.out / "decode_profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
