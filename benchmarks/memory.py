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
``extra / one full cache``. glibc's mmap threshold is fixed at 128 KiB in the children (``MALLOC_MMAP_THRESHOLD_``,
recorded per row) so freed tensors leave the resident set instead of being kept by the allocator, which would
otherwise inflate the peaks of later allocations. The rows measured before chunked prefills used 1 MiB; a prefill in
chunks of 1K tokens makes per-head tensors under 1 MiB (256 KiB on SmolLM2), which glibc's heap then kept: a profiling
sample at 2K tokens read 2.14 C at 1 MiB and 1.74 C at 128 KiB, the same code.

``--prefill-chunk`` sets the most tokens per prefill pass (``EvalConfig.prefill_chunk`` and
``ProfilingConfig.prefill_chunk``; default the library's, 8,192; ``none``: one pass): a longer prompt is prefilled in
chunks over its growing cache. Every row records the chunk it ran with; the rows measured before chunked prefills
existed (keys without ``/chunk=``) are kept and marked ``before`` (one pass, and profiling's clean continuation over
a copy of the cache).

Computed: the same budget for Llama-3.1-8B, Qwen2.5-7B and Mistral-7B-v0.3 (their ``config.json`` values, bf16) at
32K and 128K tokens: weights, one full cache, what a prefill record held per layer before (every layer's input
hidden states) and holds now (the last ``window_size + 1``), one layer's activations of an unchunked prefill and of
a prefill in chunks of the default size, and whether an 8B fidelity sample at 128K fits one 80 GB GPU.

Results go to ``benchmarks/results/memory.json`` and ``memory.txt``; finished (kind, length, chunk) rows are kept and
a rerun measures only the missing ones.

    python benchmarks/memory.py                        # 2048, 4096, 8192 tokens, the default chunk
    python benchmarks/memory.py --prefill-chunk 1024   # the same prefilled in chunks of 1,024 tokens
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
DEFAULT_CHUNK = 8192  # ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK (checked in main)
MMAP_THRESHOLD = 128 * 2**10  # glibc's MALLOC_MMAP_THRESHOLD_ in the children (see the module docstring)


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


def _eval_config(kind: str, length: int, skip: int, prefill_chunk: int | None = DEFAULT_CHUNK) -> Any:
    from ripplekv_eval.running.config import EvalConfig

    return EvalConfig(
        prefill_chunk=prefill_chunk,
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
    from ripplekv_eval.running.runner import build_samples

    for skip in range(50):
        samples = build_samples(_eval_config("fidelity", length, skip), tokenizer, model)
        if samples and len(samples[0].input_ids) >= 0.95 * length:
            return skip, len(samples[0].input_ids)
    raise RuntimeError(f"no {TASK} record of {length} tokens in the first 50")


def child(kind: str, length: int, prefill_chunk: int | None) -> dict[str, Any]:
    """Measure one sample in this (fresh) process; see the module docstring."""
    import torch
    from transformers.utils import logging as hf_logging

    from ripplekv.inference.generate import full_cache_bytes
    from ripplekv.models.loading import load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model("smollm2-135m", dtype="float32")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad():
        model(torch.arange(16).unsqueeze(0))
    if kind == "profile":
        from ripplekv.profiling.calibration import default_calibration
        from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model

        calibration = default_calibration(tokenizer, n_samples=1, context_tokens=length, continuation_tokens=32)
        profiling = ProfilingConfig(prefill_chunk=prefill_chunk)
        tokens, skip = length, None
    else:
        from ripplekv.models.attention import enable_varlen_attention
        from ripplekv_eval.running.rows import SampleRunner
        from ripplekv_eval.running.runner import build_presses, build_samples, load_run_profiles

        enable_varlen_attention(model)
        skip, tokens = _long_record(tokenizer, model, length)
        config = _eval_config(kind, length, skip, prefill_chunk)
        sample = build_samples(config, tokenizer, model)[0]  # the data is read before the baseline
        presses = build_presses(config, load_run_profiles(config).profile, model)
        runner = SampleRunner(config, model, tokenizer, presses)
    baseline = _status("VmRSS")
    phases: dict[str, int] = {}
    if kind != "profile":  # the peak of the recorded prefill apart from the rest of the sample
        from ripplekv_eval.running import rows as rows_module

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
        profile_model(model, tokenizer, calibration, profiling)
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
        "prefill_chunk": prefill_chunk,
        "malloc_mmap_threshold": int(os.environ.get("MALLOC_MMAP_THRESHOLD_", "0")) or None,
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


def chunk_activations(spec: dict[str, Any], tokens: int) -> int:
    """bf16 bytes of one decoder layer's activations over a pass of ``tokens`` queries (the prefill's peak on top of
    the cache): the MLP's three live ``tokens x intermediate`` tensors (``act(gate)``, ``up``, their product), four
    ``tokens x hidden`` (the residual, its norm, the attention output and its projection) and the queries, keys and
    values with their rotated copies. FlashAttention-2's (or sdpa's fused kernels') workspace, linear in the queries,
    is left out; a dense ``tokens x keys`` score matrix (eager attention) would come on top."""
    qkv = (spec["heads"] + 2 * spec["kv_heads"]) * spec["head_dim"]
    return tokens * (3 * spec["intermediate"] + 4 * spec["hidden"] + 2 * qkv) * BF16


def budget(spec: dict[str, Any], tokens: int, chunk: int = DEFAULT_CHUNK) -> dict[str, Any]:
    """The bf16 memory of a fidelity sample of ``tokens`` tokens, before and after the record keeps a tail, with
    an unchunked prefill's and a chunked prefill's activations (chunks of ``chunk`` tokens)."""
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
    chunked = chunk_activations(spec, min(tokens, chunk))  # one layer's activations over one chunk
    before = weights + cache + hidden_all + cache  # + every layer's hidden states + a DynamicLayer fork's copy
    after = weights + cache + hidden_tail + layer_copy
    # deriving a 30% cache from the record: the derived layers so far, plus SnapKV's scoring of one layer (kvpress:
    # the layer's keys repeated to every query head, the window's attention weights and their float32 softmax)
    scoring = spec["heads"] * tokens * spec["head_dim"] * BF16 + 2 * spec["heads"] * WINDOW * tokens * 4
    deriving = weights + cache + hidden_tail + int(0.3 * cache) + scoring
    return {
        "params": params,
        "weights_bytes": weights,
        "full_cache_bytes": cache,
        "hidden_states_all_layers_bytes": hidden_all,
        "hidden_states_tail_bytes": hidden_tail,
        "one_layer_copy_bytes": layer_copy,
        "unchunked_prefill_mlp_bytes": mlp,
        "prefill_chunk": chunk,
        "chunked_prefill_activation_bytes": chunked,
        "before_bytes": before,
        "after_bytes": after,
        "after_with_unchunked_prefill_bytes": after + mlp,
        "after_with_chunked_prefill_bytes": after + chunked,
        "snapkv_scoring_one_layer_bytes": scoring,
        "deriving_a_30pc_cache_bytes": deriving,
        "fits_80gb_before": before <= GPU_BYTES,
        "fits_80gb_after": after <= GPU_BYTES,
        "fits_80gb_after_unchunked_prefill": after + mlp <= GPU_BYTES,
        "fits_80gb_after_chunked_prefill": after + chunked <= GPU_BYTES,
    }


# ------------------------------------------------------------------------------------------------------ the report


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def row_key(kind: str, length: int, chunk: int | None) -> str:
    """The results key of a measurement: ``kind@length/chunk=N`` (``none``: one pass)."""
    return f"{kind}@{length}/chunk={'none' if chunk is None else chunk}"


def _chunk_label(row: dict[str, Any]) -> str:
    if "prefill_chunk" not in row:
        return "before"  # measured before chunked prefills (one pass; profiling's clean pass over a cache copy)
    chunk = row["prefill_chunk"]
    if chunk is None or row["prompt_tokens"] <= chunk:
        return f"{'none' if chunk is None else chunk} (1 pass)"
    return str(chunk)


def _order(item: tuple[str, dict[str, Any]]) -> tuple[int, int, int, int]:
    row = item[1]
    before = "prefill_chunk" not in row
    chunk = row.get("prefill_chunk") or 0
    return (KINDS.index(row["kind"]), row["length"], 0 if before else 1, -chunk)


def report(measured: dict[str, dict[str, Any]]) -> str:
    rows = sorted(measured.items(), key=_order)
    lines = [
        "Peak memory of one sample, SmolLM2-135M float32 on this CPU, each in a fresh process (benchmarks/memory.py)",
        "",
        "extra = peak RSS - RSS after loading the model; C = one full cache of the prompt; W = weights",
        "chunk = --prefill-chunk (most tokens per prefill pass; '(1 pass)': the prompt fits one chunk); before = "
        "measured before chunked prefills existed (one pass, profiling's clean pass over a copy of the cache, "
        "teacher forcing's float64 rows at once, glibc mmap threshold 1 MiB; the other rows: 128 KiB)",
        "",
        f"{'kind':9} {'tokens':>6} {'chunk':>12} {'W GiB':>6} {'C GiB':>6} {'base GiB':>8} {'peak GiB':>8} "
        f"{'extra GiB':>9} {'(W+extra)/(W+C)':>15} {'extra/C':>7} {'s':>6}",
    ]
    for _, row in rows:
        lines.append(
            f"{row['kind']:9} {row['prompt_tokens']:>6} {_chunk_label(row):>12} {_gib(row['weights_bytes']):>6} "
            f"{_gib(row['full_cache_bytes']):>6} {_gib(row['baseline_rss_bytes']):>8} {_gib(row['peak_rss_bytes']):>8}"
            f" {_gib(row['extra_bytes']):>9} {row['ratio_to_weights_plus_cache']:>15.3f}"
            f" {row['extra_in_full_caches']:>7.3f} {row['seconds']:>6.0f}"
        )
    phased = [(k, r) for k, r in rows if "prefill_peak_in_full_caches" in r]
    if phased:
        lines += [
            "",
            "where it goes (extra over the baseline, in C): the recorded prefill's peak, the record it keeps, "
            "the peak of everything after it",
        ]
        for _, row in phased:
            label = f"{row['kind']}@{row['length']} {_chunk_label(row)}"
            lines.append(
                f"{label:28} prefill peak {row['prefill_peak_in_full_caches']:.3f}  record "
                f"{row['record_in_full_caches']:.3f}  after the prefill {row['after_prefill_peak_in_full_caches']:.3f}"
            )
    by_chunk: dict[str, list[float]] = {}
    for _, row in rows:
        if row["kind"] == "fidelity":
            chunk = "before" if "prefill_chunk" not in row else str(row["prefill_chunk"])
            by_chunk.setdefault(chunk, []).append(row["extra_in_full_caches"])
    if by_chunk:
        lines += ["", "goal: fidelity extra <= 1.5 C"]
        for chunk, extras in by_chunk.items():
            verdict = "met" if max(extras) <= 1.5 else "NOT met"
            lines.append(f"  chunk {chunk:>6}: {verdict} (largest {max(extras):.3f} C)")
    lines += [
        "",
        f"Computed budget of a fidelity sample, bf16 (config.json values), window {WINDOW}: GiB",
        "before: W + C + every layer's hidden states + a DynamicLayer fork's copy of C; "
        "after: W + C + the last window+1 hidden states + one layer's transient copy;",
        f"+unchunked: after + one layer's MLP activations over the whole prompt; +chunked: after + one layer's "
        f"activations over a chunk of {DEFAULT_CHUNK} tokens (MLP, residual, q/k/v; FlashAttention's workspace not "
        "counted)",
        "",
        f"{'model':26} {'tokens':>6} {'W':>6} {'C':>6} {'hidden all':>10} {'tail':>6} {'before':>7} "
        f"{'after':>6} {'+unchunked':>10} {'+chunked':>8} {'fits 80GB before/after/unchunked/chunked':>41}",
    ]
    for name, spec in MODELS.items():
        for tokens in (32 * 1024, 128 * 1024):
            b = budget(spec, tokens)
            fits = "/".join(
                "yes" if b[key] else "no"
                for key in (
                    "fits_80gb_before",
                    "fits_80gb_after",
                    "fits_80gb_after_unchunked_prefill",
                    "fits_80gb_after_chunked_prefill",
                )
            )
            lines.append(
                f"{name:26} {tokens // 1024:>5}K {_gib(b['weights_bytes']):>6} {_gib(b['full_cache_bytes']):>6} "
                f"{_gib(b['hidden_states_all_layers_bytes']):>10} {_gib(b['hidden_states_tail_bytes']):>6} "
                f"{_gib(b['before_bytes']):>7} {_gib(b['after_bytes']):>6} "
                f"{_gib(b['after_with_unchunked_prefill_bytes']):>10} {_gib(b['after_with_chunked_prefill_bytes']):>8} "
                f"{fits:>41}"
            )
    llama = budget(MODELS["meta-llama/Llama-3.1-8B"], 128 * 1024)
    lines += [
        "",
        f"Llama-3.1-8B at 128K on one 80 GB GPU ({GPU_BYTES / GIB:.1f} GiB): before {_gib(llama['before_bytes'])} GiB "
        f"({'fits' if llama['fits_80gb_before'] else 'does not fit'}), after {_gib(llama['after_bytes'])} GiB "
        f"({'fits' if llama['fits_80gb_after'] else 'does not fit'}); with one layer's unchunked prefill MLP "
        f"activations {_gib(llama['after_with_unchunked_prefill_bytes'])} GiB, with a prefill in chunks of "
        f"{DEFAULT_CHUNK} tokens {_gib(llama['after_with_chunked_prefill_bytes'])} GiB "
        f"(chunk activations {_gib(llama['chunked_prefill_activation_bytes'])} GiB = "
        f"{llama['chunked_prefill_activation_bytes'] / llama['full_cache_bytes']:.3f} C); while a 30% cache is "
        f"derived from the record (0.3 C, plus SnapKV's scoring of one layer, "
        f"{llama['snapkv_scoring_one_layer_bytes'] / llama['full_cache_bytes']:.3f} C) "
        f"{_gib(llama['deriving_a_30pc_cache_bytes'])} GiB. The attention kernel's workspace and the allocator's "
        "slack come on top.",
    ]
    return "\n".join(lines) + "\n"


def _computed() -> dict[str, Any]:
    return {name: {str(t): budget(spec, t) for t in (32 * 1024, 128 * 1024)} for name, spec in MODELS.items()}


def main() -> None:
    from ripplekv.cli.args import prefill_chunk_arg  # torch-free

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2048,4096,8192", help="prompt lengths in tokens (comma-separated)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"from {', '.join(KINDS)}")
    parser.add_argument(
        "--prefill-chunk",
        type=prefill_chunk_arg,
        default=DEFAULT_CHUNK,
        help=f"most tokens per prefill pass (default {DEFAULT_CHUNK}, the library's; none: one pass)",
    )
    parser.add_argument("--out", default=str(RESULTS), help="folder of memory.json and memory.txt")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "LENGTH", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, length, chunk = args.child[0], int(args.child[1]), prefill_chunk_arg(args.child[2])
        print("RESULT " + json.dumps(child(kind, length, chunk)), flush=True)
        return
    from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK

    if DEFAULT_PREFILL_CHUNK != DEFAULT_CHUNK:
        raise SystemExit(f"DEFAULT_CHUNK {DEFAULT_CHUNK} is not the library's default chunk {DEFAULT_PREFILL_CHUNK}")
    lengths = [int(x) for x in args.lengths.split(",")]
    kinds = [k.strip() for k in args.kinds.split(",")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; choose from {KINDS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "memory.json"
    measured: dict[str, dict[str, Any]] = json.loads(path.read_text())["measured"] if path.exists() else {}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "TOKENIZERS_PARALLELISM": "false"}
    chunk = args.prefill_chunk
    for length in lengths:
        for kind in kinds:
            key = row_key(kind, length, chunk)
            if key in measured:
                print(f"{key}: done before", flush=True)
                continue
            print(f"{key}: measuring", flush=True)
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(length), "none" if chunk is None else str(chunk)],
                env=env,
                capture_output=True,
                text=True,
            )
            results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not results:
                raise SystemExit(f"{key} failed ({done.returncode}):\n{done.stderr[-4000:]}")
            measured[key] = json.loads(results[-1].removeprefix("RESULT "))
            print(f"{key}: extra {measured[key]['extra_in_full_caches']} C", flush=True)
            path.write_text(json.dumps({"measured": measured, "computed": _computed(), "models": MODELS}, indent=2))
            (out / "memory.txt").write_text(report(measured))
    path.write_text(json.dumps({"measured": measured, "computed": _computed(), "models": MODELS}, indent=2))
    text = report(measured)
    (out / "memory.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
