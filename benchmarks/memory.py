"""Peak memory of one ``eval`` sample and one profiling sample, measured on this CPU, and the budget of 7-8B models.

Measured (SmolLM2-135M, float32, each in a fresh subprocess so every peak is that sample's own):

* ``fidelity``: one LongBench prompt (hotpotqa, middle-truncated to the length) under ``eval --score fidelity``,
  methods full, snapkv, pyramidkv, adakv and ripplekv (the committed profile) at 10/20/30%;
* ``both``: the same under ``eval --score both`` (every configuration decoded, batched, the default memory bound);
* ``profile``: one calibration window (``default_calibration``: essay text, 32 continuation tokens) through
  ``profile_model`` with the default settings.

Each child loads the model, runs a 16-token warm-up pass, reads the sample's data and builds the presses, reads
its resident set size (the *baseline*: Python, torch, the tokenizer, the weights and the data), resets the
kernel's high-water mark (``/proc/self/clear_refs``) and runs the sample (``SampleRunner.run_sample``, what
``ripplekv eval`` runs per sample; ``profile_model``); its peak is then ``VmHWM`` (``getrusage(RUSAGE_SELF)
.ru_maxrss`` where the reset is unavailable, which then includes loading). ``extra`` = peak - baseline: what
the sample allocates over the loaded model. Reported as ``(weights + extra) / (weights + one full cache)`` and as
``extra / one full cache``. glibc's mmap threshold is fixed at 1 MiB in the children (``MALLOC_MMAP_THRESHOLD_``)
so freed large tensors leave the resident set instead of being kept by the allocator, which would otherwise
inflate the peaks of later allocations.

Computed: the same budget for Llama-3.1-8B, Qwen2.5-7B and Mistral-7B-v0.3 (their ``config.json`` values, bf16) at
32K and 128K tokens: weights, one full cache, what a prefill record held per layer before (every layer's input
hidden states) and holds now (the last ``window_size + 1``), and whether an 8B fidelity sample at 128K fits one
80 GB GPU.

Results go to ``benchmarks/results/memory.json`` and ``memory.txt``; finished (kind, length) pairs are kept and a
rerun measures only the missing ones.

    python benchmarks/memory.py                        # 2048, 4096, 8192 tokens
    python benchmarks/memory.py --lengths 2048 --kinds fidelity
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
PROFILE = RESULTS / "smollm2-135m.profile.json"
DATA_DIR = Path("/work/shared/data/longbench")
KINDS = ("fidelity", "both", "profile")
METHODS = ("full", "snapkv", "pyramidkv", "adakv", "ripplekv")
BUDGETS = (0.1, 0.2, 0.3)
TASK = "hotpotqa"
WINDOW = 64  # the eval default: a record keeps WINDOW + 1 hidden states per layer
GPU_BYTES = 80 * 10**9  # one "80 GB" GPU, counted in decimal gigabytes (the lower reading)

# config.json of each model card (huggingface.co/<id>/blob/main/config.json): num_hidden_layers,
# num_key_value_heads, head_dim (hidden_size / num_attention_heads where absent), hidden_size, intermediate_size,
# num_attention_heads, vocab_size, tie_word_embeddings.
MODELS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.1-8B": {
        "layers": 32,
        "kv_heads": 8,
        "heads": 32,
        "head_dim": 128,
        "hidden": 4096,
        "intermediate": 14336,
        "vocab": 128256,
        "tied": False,
    },
    "Qwen/Qwen2.5-7B": {
        "layers": 28,
        "kv_heads": 4,
        "heads": 28,
        "head_dim": 128,
        "hidden": 3584,
        "intermediate": 18944,
        "vocab": 152064,
        "tied": False,
    },
    "mistralai/Mistral-7B-v0.3": {
        "layers": 32,
        "kv_heads": 8,
        "heads": 32,
        "head_dim": 128,
        "hidden": 4096,
        "intermediate": 14336,
        "vocab": 32768,
        "tied": False,
    },
}
BF16 = 2
GIB = 2**30


# ----------------------------------------------------------------------------------------------- the children


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1)) * 1024


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _eval_config(kind: str, length: int, skip: int) -> Any:
    from ripplekv.evaluation.running.runner import EvalConfig

    return EvalConfig(
        suite="longbench",
        model="smollm2-135m",
        methods=METHODS,
        budgets=BUDGETS,
        tasks=(TASK,),
        limit=1,
        profile=str(PROFILE),
        dtype="float32",
        score=kind,
        options={"data_dir": str(DATA_DIR), "max_length": length, "skip": skip or None},
    )


def _long_record(tokenizer: Any, model: Any, length: int) -> tuple[int, int]:
    """The first record of the task whose prompt fills the length (``skip``, prompt tokens)."""
    from ripplekv.evaluation.running.runner import build_samples

    for skip in range(50):
        samples = build_samples(_eval_config("fidelity", length, skip), tokenizer, model)
        if samples and len(samples[0].input_ids) >= 0.95 * length:
            return skip, len(samples[0].input_ids)
    raise RuntimeError(f"no {TASK} record of {length} tokens in the first 50")


def child(kind: str, length: int) -> dict[str, Any]:
    """Measure one sample in this (fresh) process; see the module docstring."""
    import torch
    from transformers.utils import logging as hf_logging

    from ripplekv.inference.generate import full_cache_bytes
    from ripplekv.models import load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model("smollm2-135m", dtype="float32")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad():
        model(torch.arange(16).unsqueeze(0))
    if kind == "profile":
        from ripplekv.profiling import ProfilingConfig, profile_model
        from ripplekv.profiling.calibration import default_calibration

        calibration = default_calibration(tokenizer, n_samples=1, context_tokens=length, continuation_tokens=32)
        tokens, skip = length, None
    else:
        from ripplekv.evaluation.running.rows import SampleRunner
        from ripplekv.evaluation.running.runner import _build_presses, build_samples, load_run_profiles
        from ripplekv.models.attention import enable_varlen_attention

        enable_varlen_attention(model)
        skip, tokens = _long_record(tokenizer, model, length)
        config = _eval_config(kind, length, skip)
        sample = build_samples(config, tokenizer, model)[0]  # the data is read before the baseline
        presses = _build_presses(config, load_run_profiles(config).profile, model)
        runner = SampleRunner(config, model, tokenizer, presses)
    baseline = _status("VmRSS")
    phases: dict[str, int] = {}
    if kind != "profile":  # the peak of the recorded prefill apart from the rest of the sample
        from ripplekv.evaluation.running import rows as rows_module

        recorded = rows_module.record_prefill

        def record_prefill(*args: Any, **kwargs: Any) -> Any:
            record = recorded(*args, **kwargs)
            phases["prefill_peak_bytes"] = _status("VmHWM") - baseline
            phases["record_bytes"] = record.nbytes()
            _reset_peak()
            return record

        rows_module.record_prefill = record_prefill  # this child process only
    exact = _reset_peak()
    start = time.perf_counter()
    if kind == "profile":
        profile_model(model, tokenizer, calibration, ProfilingConfig())
    else:  # what `ripplekv eval` runs for one sample (run_pending writes each row as it comes)
        rows = list(runner.run_sample(sample, config.configurations))
        if len(rows) != len(config.configurations):
            raise RuntimeError(f"{len(rows)} rows for {len(config.configurations)} configurations")
    seconds = time.perf_counter() - start
    peak = _status("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    full = full_cache_bytes(model, tokens)
    if "prefill_peak_bytes" in phases and exact:
        phases["after_prefill_peak_bytes"] = peak - baseline
        peak = baseline + max(phases["prefill_peak_bytes"], phases["after_prefill_peak_bytes"])
    return {
        "kind": kind,
        "length": length,
        "prompt_tokens": tokens,
        "longbench_skip": skip,
        "weights_bytes": weights,
        "full_cache_bytes": full,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "extra_bytes": peak - baseline,
        "peak_reset": exact,
        "ratio_to_weights_plus_cache": round((weights + peak - baseline) / (weights + full), 3),
        "extra_in_full_caches": round((peak - baseline) / full, 3),
        "seconds": round(seconds, 1),
        **phases,
        **{k.replace("_bytes", "_in_full_caches"): round(v / full, 3) for k, v in phases.items()},
    }


# ---------------------------------------------------------------------------------------------- the computed budget


def budget(spec: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The bf16 memory of a fidelity sample of ``tokens`` tokens, before and after the record keeps a tail."""
    layers, hidden, inter, vocab = spec["layers"], spec["hidden"], spec["intermediate"], spec["vocab"]
    attention = (
        hidden * (spec["heads"] + 2 * spec["kv_heads"]) * spec["head_dim"] + spec["heads"] * spec["head_dim"] * hidden
    )
    params = vocab * hidden * (1 if spec["tied"] else 2) + layers * (attention + 3 * hidden * inter + 2 * hidden)
    weights = params * BF16
    cache = 2 * layers * spec["kv_heads"] * spec["head_dim"] * tokens * BF16
    hidden_all = layers * hidden * tokens * BF16
    hidden_tail = layers * hidden * (WINDOW + 1) * BF16
    layer_copy = cache // layers  # a lean pass concatenates one layer at a time
    mlp = 3 * tokens * inter * BF16  # one layer's MLP activations in an unchunked prefill (gate, up, product)
    before = weights + cache + hidden_all + cache  # + every layer's hidden states + a DynamicLayer fork's copy
    after = weights + cache + hidden_tail + layer_copy
    return {
        "params": params,
        "weights_bytes": weights,
        "full_cache_bytes": cache,
        "hidden_states_all_layers_bytes": hidden_all,
        "hidden_states_tail_bytes": hidden_tail,
        "one_layer_copy_bytes": layer_copy,
        "unchunked_prefill_mlp_bytes": mlp,
        "before_bytes": before,
        "after_bytes": after,
        "after_with_unchunked_prefill_bytes": after + mlp,
        "fits_80gb_before": before <= GPU_BYTES,
        "fits_80gb_after": after <= GPU_BYTES,
        "fits_80gb_after_unchunked_prefill": after + mlp <= GPU_BYTES,
    }


# ------------------------------------------------------------------------------------------------------ the report


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def report(measured: dict[str, dict[str, Any]], lengths: list[int]) -> str:
    lines = [
        "Peak memory of one sample, SmolLM2-135M float32 on this CPU, each in a fresh process (benchmarks/memory.py)",
        "",
        "extra = peak RSS - RSS after loading the model; C = one full cache of the prompt; W = weights",
        "",
        f"{'kind':9} {'tokens':>6} {'W GiB':>6} {'C GiB':>6} {'base GiB':>8} {'peak GiB':>8} {'extra GiB':>9} "
        f"{'(W+extra)/(W+C)':>15} {'extra/C':>7} {'s':>6}",
    ]
    for kind in KINDS:
        for length in lengths:
            row = measured.get(f"{kind}@{length}")
            if row is None:
                continue
            lines.append(
                f"{kind:9} {row['prompt_tokens']:>6} {_gib(row['weights_bytes']):>6} {_gib(row['full_cache_bytes']):>6}"
                f" {_gib(row['baseline_rss_bytes']):>8} {_gib(row['peak_rss_bytes']):>8} {_gib(row['extra_bytes']):>9}"
                f" {row['ratio_to_weights_plus_cache']:>15.3f} {row['extra_in_full_caches']:>7.3f}"
                f" {row['seconds']:>6.0f}"
            )
    phased = [(k, measured[k]) for k in measured if "prefill_peak_in_full_caches" in measured[k]]
    if phased:
        lines += [
            "",
            "where it goes (extra over the baseline, in C): the recorded prefill's peak, the record it keeps, "
            "the peak of everything after it",
        ]
        for key, row in sorted(phased, key=lambda item: (KINDS.index(item[1]["kind"]), item[1]["length"])):
            lines.append(
                f"{key:14} prefill peak {row['prefill_peak_in_full_caches']:.3f}  record "
                f"{row['record_in_full_caches']:.3f}  after the prefill {row['after_prefill_peak_in_full_caches']:.3f}"
            )
    fidelity = [measured[k]["extra_in_full_caches"] for k in measured if k.startswith("fidelity@")]
    if fidelity:
        verdict = "met" if max(fidelity) <= 1.5 else "NOT met"
        lines += ["", f"goal: fidelity extra <= 1.5 C: {verdict} (largest {max(fidelity):.3f} C)"]
    lines += [
        "",
        f"Computed budget of a fidelity sample, bf16 (config.json values), window {WINDOW}: GiB",
        "before: W + C + every layer's hidden states + a DynamicLayer fork's copy of C; "
        "after: W + C + the last window+1 hidden states + one layer's transient copy",
        "",
        f"{'model':26} {'tokens':>6} {'W':>6} {'C':>6} {'hidden all':>10} {'tail':>6} {'before':>7} "
        f"{'after':>6} {'+prefill MLP':>12} {'fits 80GB before/after/unchunked':>33}",
    ]
    for name, spec in MODELS.items():
        for tokens in (32 * 1024, 128 * 1024):
            b = budget(spec, tokens)
            fits = "/".join(
                "yes" if b[key] else "no"
                for key in ("fits_80gb_before", "fits_80gb_after", "fits_80gb_after_unchunked_prefill")
            )
            lines.append(
                f"{name:26} {tokens // 1024:>5}K {_gib(b['weights_bytes']):>6} {_gib(b['full_cache_bytes']):>6} "
                f"{_gib(b['hidden_states_all_layers_bytes']):>10} {_gib(b['hidden_states_tail_bytes']):>6} "
                f"{_gib(b['before_bytes']):>7} {_gib(b['after_bytes']):>6} "
                f"{_gib(b['after_with_unchunked_prefill_bytes']):>12} {fits:>33}"
            )
    llama = budget(MODELS["meta-llama/Llama-3.1-8B"], 128 * 1024)
    lines += [
        "",
        f"Llama-3.1-8B at 128K on one 80 GB GPU ({GPU_BYTES / GIB:.1f} GiB): before {_gib(llama['before_bytes'])} GiB "
        f"({'fits' if llama['fits_80gb_before'] else 'does not fit'}), after {_gib(llama['after_bytes'])} GiB "
        f"({'fits' if llama['fits_80gb_after'] else 'does not fit'}); with one layer's unchunked prefill MLP "
        f"activations {_gib(llama['after_with_unchunked_prefill_bytes'])} GiB "
        f"({'fits' if llama['fits_80gb_after_unchunked_prefill'] else 'does not fit'}). Activations, the attention "
        "kernel's workspace and the allocator's slack come on top.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2048,4096,8192", help="prompt lengths in tokens (comma-separated)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"from {', '.join(KINDS)}")
    parser.add_argument("--out", default=str(RESULTS), help="folder of memory.json and memory.txt")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], int(args.child[1]))), flush=True)
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    kinds = [k.strip() for k in args.kinds.split(",")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; choose from {KINDS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "memory.json"
    measured: dict[str, dict[str, Any]] = json.loads(path.read_text())["measured"] if path.exists() else {}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20), "TOKENIZERS_PARALLELISM": "false"}
    for length in lengths:
        for kind in kinds:
            key = f"{kind}@{length}"
            if key in measured:
                print(f"{key}: done before", flush=True)
                continue
            print(f"{key}: measuring", flush=True)
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(length)], env=env, capture_output=True, text=True
            )
            results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not results:
                raise SystemExit(f"{key} failed ({done.returncode}):\n{done.stderr[-4000:]}")
            measured[key] = json.loads(results[-1].removeprefix("RESULT "))
            print(f"{key}: extra {measured[key]['extra_in_full_caches']} C", flush=True)
            computed = {
                name: {str(t): budget(spec, t) for t in (32 * 1024, 128 * 1024)} for name, spec in MODELS.items()
            }
            path.write_text(json.dumps({"measured": measured, "computed": computed, "models": MODELS}, indent=2))
            (out / "memory.txt").write_text(report(measured, sorted({int(k.split("@")[1]) for k in measured})))
    computed = {name: {str(t): budget(spec, t) for t in (32 * 1024, 128 * 1024)} for name, spec in MODELS.items()}
    path.write_text(json.dumps({"measured": measured, "computed": computed, "models": MODELS}, indent=2))
    text = report(measured, sorted({int(k.split("@")[1]) for k in measured}))
    (out / "memory.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
