"""Efficiency of full, SnapKV, PyramidKV, AdaKV, RippleKV and the per-prompt schedules (CAKE, SqueezeAttention,
DynamicKV, LAVa): time, decoding speed, cache bytes and peak memory.

The paper's efficiency section, measured in one run on the default model (SmolLM2-135M, float32, CPU) at each prompt
length (``--lengths``, essay text) and budget (``--budgets``):

1. **prefill-and-compress wall time**: a real ``prefill(model, ids, press)`` per configuration (the forward pass
   with the press's hooks and its compression; nothing derived from a shared record), ``--repeats`` times, the
   median, and its ratio to SnapKV's at the same length and budget (goal: RippleKV <= 1.02; the per-prompt
   schedules compute per-layer statistics during the prefill, which RippleKV, allocating offline, does not). The
   configurations' repeats are interleaved, each round in a rotated order, so drift on a shared machine hits every
   method alike;
2. **decoding milliseconds per step**: greedy decoding over the compressed cache, exactly ``--steps`` forward passes
   of one token (stop tokens banned), median over the repeats;
3. **bytes the cache holds** against the full cache: the key/value tensors really held (kvpress's AdaKV keeps
   every key and only masks: its held fraction is 1.0, plus its mask indices) and the effective kept fraction;
4. **peak resident memory** of each configuration's prefill + decoding, in a fresh subprocess per configuration.
   Why a subprocess: in one process the allocator keeps memory it has freed, so the peak is monotone over the run
   and cannot be attributed to one configuration, and a sampling thread would both miss short peaks (a layer's
   attention lasts milliseconds) and perturb the timings. The child loads the (cached, converted) model, warms up,
   resets the kernel's high-water mark (``/proc/self/clear_refs``), runs the configuration and reads ``VmHWM``, the
   kernel's exact peak RSS (no sampling), after the prefill and again after decoding; ``over model`` subtracts the
   RSS just before the prefill (model weights and runtime). The child runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so
   that glibc unmaps freed blocks at once and RSS follows live memory (with glibc's dynamic threshold, one
   configuration's peak varied by 25 MiB between runs). Decoding runs over a fork of the prefilled cache, as every
   RippleKV decode does, so while decoding the prompt's cache is held twice (the prefill's and the fork's grown
   copy). Where the reset is not possible, ``ru_maxrss`` (peak since the child started) is reported instead.

A table **computed** from model configurations (no measurement) follows: bf16 KV bytes of Llama-3.1-8B-Instruct,
Qwen2.5-7B-Instruct and Mistral-7B-Instruct-v0.3 at 32K and 128K tokens. Prints tables, writes ``--out`` (JSON) and
PNG plots into ``--plots``.

With ``--out``, the JSON is rewritten after each length (``"complete": false`` until the last one): re-running the
same command with the same settings (model, dtype, threads, repeats, steps, budgets, profile, memory on or off) keeps
the lengths already measured and measures the rest, so an interrupted run loses at most the length it was on. Every
ratio compares configurations measured side by side within one length, so lengths from two processes are never
compared with each other; each length records when it was measured.

    python -m benchmarks.efficiency --out benchmarks/results/efficiency.json --plots benchmarks/results
    python -m benchmarks.efficiency --quick          # smoke test: 1K tokens, 1 repeat, 10% only
    python -m benchmarks.efficiency --methods snapkv,ripplekv,cake,squeezeattention,dynamickv,lava --skip-memory \
        --lengths 1024,2048,4096 --out benchmarks/results/efficiency-per-prompt.json
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from benchmarks.kv_accounting import (
    KVShape,
    cache_footprint,
    computed_kv_table,
    peak_allocated,
    reset_peak_allocated,
    synchronize,
)
from ripplekv.cli.args import method_list
from ripplekv.inference.generate import eos_ids, greedy_decode, prefill
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.haystack import essays, token_stream
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_PROFILE = Path(__file__).parent / "results" / "smollm2-135m.profile.json"
METHODS = ("full", "snapkv", "pyramidkv", "adakv", "ripplekv", "cake", "squeezeattention", "dynamickv", "lava")
PER_PROMPT = ("cake", "squeezeattention", "dynamickv", "lava")  # schedules computing statistics at inference
GOAL = 1.02  # RippleKV's prefill-and-compress time over SnapKV's
MIB = 2**20

# Computed table. From each model's config.json on the Hugging Face hub: num_hidden_layers, num_key_value_heads, and
# head_dim (Mistral's config.json has head_dim = 128; Llama-3.1's and Qwen2.5's have none, so hidden_size /
# num_attention_heads: 4096 / 32 = 128 and 3584 / 28 = 128).
PUBLISHED = (
    KVShape("Llama-3.1-8B-Instruct", layers=32, kv_heads=8, head_dim=128),
    KVShape("Qwen2.5-7B-Instruct", layers=28, kv_heads=4, head_dim=128),
    KVShape("Mistral-7B-Instruct-v0.3", layers=32, kv_heads=8, head_dim=128),
)
COMPUTED_LENGTHS = (32 * 1024, 128 * 1024)
COMPUTED_BUDGETS = (0.1, 0.2, 0.3)  # the paper's budgets, whatever --budgets is
BF16_BYTES = 2


def prompt_ids(tokenizer: Any, length: int) -> torch.Tensor:
    """The first ``length`` tokens of the essay corpus, shape ``(1, length)``."""
    _, ids = token_stream(tokenizer, [text for _, text in essays()], length)
    if len(ids) < length:
        raise SystemExit(f"the essay corpus has only {len(ids)} tokens, fewer than {length}")
    return torch.tensor([ids[:length]])


def configurations(budgets: tuple[float, ...], methods: tuple[str, ...]) -> list[tuple[str, float]]:
    """``full`` once (where it is among ``methods``), then every compressed method at every budget."""
    head = [("full", 1.0)] if "full" in methods else []
    return head + [(m, b) for b in budgets for m in methods if m != "full"]


def build_press(method: str, budget: float, profile: SensitivityProfile | None) -> Any:
    return make_press(method, budget=budget, profile=profile if method.startswith("ripplekv") else None)


def decode_seconds(model: Any, state: Any, steps: int, stops: set[int]) -> float:
    """Wall time of exactly ``steps`` one-token forward passes (``steps + 1`` tokens, stop tokens banned)."""
    synchronize(state.next_logits.device)
    start = time.perf_counter()
    tokens = greedy_decode(model, state, steps + 1, stops, min_new_tokens=steps + 1)
    synchronize(state.next_logits.device)
    seconds = time.perf_counter() - start
    if len(tokens) != steps + 1:
        raise RuntimeError(f"decoded {len(tokens)} tokens, expected {steps + 1}")
    return seconds


def measure_length(
    model: Any, tokenizer: Any, ids: torch.Tensor, configs: list, profile: Any, args: Any, warmup: bool = True
) -> dict:
    """Interleaved timed prefills and decodes of every configuration at one length; footprints from the first round.

    ``warmup``: one untimed full prefill at this length first (off where every configuration was warmed up already).

    On a CUDA device every timing is between synchronisations, and ``device_memory`` holds, per configuration (first
    round), the allocator's bytes before the prefill (``before``: weights and runtime), its peak during the prefill
    (``prefill_peak``) and during prefill + decoding (``peak``); empty off CUDA (the RSS children measure there).
    """
    device = next(model.parameters()).device
    stops = eos_ids(model, tokenizer)
    if warmup:
        prefill(model, ids)  # warm-up at this length, not timed
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    decodes: dict[tuple, list[float]] = {c: [] for c in configs}
    footprints: dict[tuple, Any] = {}
    device_memory: dict[tuple, dict[str, int]] = {}
    for round_index in range(args.repeats):
        shift = (round_index * max(1, len(configs) // args.repeats)) % len(configs)
        for config in configs[shift:] + configs[:shift]:
            press = build_press(*config, profile)
            gc.collect()
            before = reset_peak_allocated(device)
            start = time.perf_counter()
            state = prefill(model, ids, press)
            synchronize(device)
            times[config].append(time.perf_counter() - start)
            prefill_peak = peak_allocated(device)
            decodes[config].append(decode_seconds(model, state, args.steps, stops))
            footprints.setdefault(config, cache_footprint(model, state))
            if before is not None:
                device_memory.setdefault(
                    config, {"before": before, "prefill_peak": prefill_peak, "peak": peak_allocated(device)}
                )
            del state
        print(f"  round {round_index + 1}/{args.repeats} done", flush=True)
    return {"times": times, "decodes": decodes, "footprints": footprints, "device_memory": device_memory}


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def child_main(spec: dict[str, Any]) -> None:
    """One configuration's prefill + decoding in this fresh process; prints its peak RSS as one JSON line."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(spec["model"])
    profile = SensitivityProfile.load(spec["profile"]) if spec["method"].startswith("ripplekv") else None
    ids = prompt_ids(tokenizer, spec["length"])
    press = build_press(spec["method"], spec["budget"], profile)
    with torch.no_grad():
        model(ids[:, :16])  # warm-up (short: little freed memory left for the prefill to reuse)
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
        reset = True
    except OSError:
        reset = False
    before = _status_bytes("VmRSS")
    scale = 1 if sys.platform == "darwin" else 1024

    def peak_now() -> int:
        hwm = _status_bytes("VmHWM")
        return hwm if reset and hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale

    state = prefill(model, ids, press)
    prefill_peak = peak_now()
    decode_seconds(model, state, spec["steps"], eos_ids(model, tokenizer))
    peak = peak_now()
    print(json.dumps({"peak_rss": peak, "prefill_peak_rss": prefill_peak, "rss_before": before, "hwm_reset": reset}))


def peak_memory(args: Any, length: int, config: tuple[str, float]) -> dict[str, Any]:
    spec = {"model": args.model, "profile": args.profile, "length": length, "method": config[0]}
    spec.update(budget=config[1], steps=args.steps, threads=args.threads)
    # glibc returns every freed block of >= 64 KiB to the OS at once, so RSS follows live memory. With its default
    # (dynamic) threshold freed blocks stay mapped and reused in varying ways: peaks of one configuration differed by
    # 25 MiB between runs at 1K tokens, more than the differences between methods.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory child for {config} at {length} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_for(
    length: int, measured: dict, memory: dict, budgets: tuple[float, ...], steps: int, methods: tuple[str, ...]
) -> list[dict]:
    """One row per (method, budget) at one length; ``full`` is repeated at each budget (its ratio to that SnapKV)."""
    rows = []
    median = {c: statistics.median(v) for c, v in measured["times"].items()}
    for budget in budgets:
        for method in methods:
            config = ("full", 1.0) if method == "full" else (method, budget)
            fp, mem = measured["footprints"][config], memory.get(config)
            decode = measured["decodes"][config]
            row = {
                "tokens": length,
                "budget": budget,
                "method": method,
                "prefill_s": round(median[config], 4),
                "prefill_s_all": [round(t, 4) for t in measured["times"][config]],
                "time_ratio_to_snapkv": round(median[config] / median[("snapkv", budget)], 4),
                "decode_ms_per_step": round(1000 * statistics.median(decode) / steps, 2),
                "held_fraction": round(fp.held_fraction, 4),
                "kept_fraction": round(fp.kept_fraction, 4),
                "held_bytes": fp.held_bytes,
                "mask_index_bytes": fp.state_bytes,
                "full_bytes": fp.full_bytes,
                "kept_tokens": list(fp.kept_tokens),
            }
            if mem is not None:
                row["peak_rss_mib"] = round(mem["peak_rss"] / MIB, 1)
                row["peak_over_model_mib"] = round((mem["peak_rss"] - (mem["rss_before"] or 0)) / MIB, 1)
                row["prefill_peak_over_model_mib"] = round(
                    (mem["prefill_peak_rss"] - (mem["rss_before"] or 0)) / MIB, 1
                )
                row["peak_is_reset_hwm"] = mem["hwm_reset"]
            rows.append(row)
    return rows


def print_measured(rows: list[dict]) -> None:
    header = "| tokens | budget | method | prefill s | / SnapKV | decode ms/step | held | kept | mask idx |"
    print(header + " peak RSS MiB | over model: prefill | prefill+decode |")
    print("|---:|---:|---|" + "---:|" * 9)
    for r in rows:
        keys = ("peak_rss_mib", "prefill_peak_over_model_mib", "peak_over_model_mib")
        peak = " | ".join(f"{r[k]:.0f}" if k in r else "-" for k in keys)
        print(
            f"| {r['tokens']} | {r['budget']:.0%} | {r['method']} | {r['prefill_s']:.3f} | "
            f"{r['time_ratio_to_snapkv']:.3f} | {r['decode_ms_per_step']:.1f} | {r['held_fraction']:.3f} | "
            f"{r['kept_fraction']:.3f} | {r['mask_index_bytes'] / r['full_bytes']:.3f} | {peak} |"
        )


def print_computed(rows: list[dict]) -> None:
    print("\nCOMPUTED from model configurations (no measurement): KV-cache GiB in bf16.")
    print("Evicting methods (SnapKV, PyramidKV, RippleKV) hold the kept tokens; kvpress's AdaKV holds the full cache")
    print("and adds int64 (batch, head, position) indices per masked entry.")
    print("| model | tokens | budget | full GiB | evicting GiB | AdaKV held GiB | AdaKV mask indices GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gib = [r[k] / 2**30 for k in ("full_bytes", "evicting_bytes", "adakv_bytes", "adakv_index_bytes")]
        print(
            f"| {r['model']} | {r['tokens'] // 1024}K | {r['budget']:.0%} | "
            + " | ".join(f"{g:.2f}" for g in gib)
            + " |"
        )


def save_plots(rows: list[dict], folder: Path, budgets: tuple[float, ...], methods: tuple[str, ...]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    lengths = sorted({r["tokens"] for r in rows})
    saved = []
    panels = (
        ("time_ratio_to_snapkv", "prefill+compress time / SnapKV", "efficiency_time_ratio.png"),
        ("decode_ms_per_step", "decoding ms per step", "efficiency_decode.png"),
        ("peak_over_model_mib", "peak RSS over the loaded model (MiB)", "efficiency_peak_rss.png"),
    )
    for key, label, name in panels:
        if not any(key in r for r in rows):
            continue
        fig, axes = plt.subplots(1, len(budgets), figsize=(4.5 * len(budgets), 3.6), squeeze=False)
        for ax, budget in zip(axes[0], budgets):
            for method in methods:
                points = [(r["tokens"], r[key]) for r in rows if r["budget"] == budget and r["method"] == method]
                ax.plot(*zip(*points), marker="o", label=method)
            if key == "time_ratio_to_snapkv":
                ax.axhline(GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {GOAL}")
            ax.set(title=f"budget {budget:.0%}", xlabel="prompt tokens", ylabel=label, xscale="log", xticks=lengths)
            ax.set_xticklabels([f"{n // 1024}K" for n in lengths])
            ax.minorticks_off()
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=120)
        plt.close(fig)
        saved.append(folder / name)
    longest = [r for r in rows if r["tokens"] == lengths[-1]]
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.5 * len(budgets), 3.6), squeeze=False)
    for ax, budget in zip(axes[0], budgets):
        sub = [r for r in longest if r["budget"] == budget]
        x = range(len(sub))
        held = [r["held_fraction"] for r in sub]
        ax.bar([i - 0.2 for i in x], held, 0.4, label="held (bytes in memory)")
        indices = [r["mask_index_bytes"] / r["full_bytes"] for r in sub]
        ax.bar([i - 0.2 for i in x], indices, 0.4, bottom=held, hatch="//", label="+ mask indices")
        ax.bar([i + 0.2 for i in x], [r["kept_fraction"] for r in sub], 0.4, label="kept (effective)")
        ax.set_xticks(list(x), [r["method"] for r in sub], rotation=30)
        ax.set(title=f"{lengths[-1] // 1024}K tokens, budget {budget:.0%}", ylabel="fraction of the full cache")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "efficiency_kv_bytes.png", dpi=120)
    plt.close(fig)
    return saved + [folder / "efficiency_kv_bytes.png"]


def resumed_rows(out: str | None, settings: dict[str, Any], lengths: tuple[int, ...]) -> list[dict]:
    """The rows of the lengths an earlier run with the same ``settings`` already wrote to ``out`` (none otherwise).

    Args:
        out: the ``--out`` JSON file (may not exist yet).
        settings: what the measurement depends on; a file written with other settings is not reused.
        lengths: the lengths this run measures (rows of other lengths are dropped).
    """
    if out is None or not Path(out).exists():
        return []
    try:
        saved = json.loads(Path(out).read_text())
    except json.JSONDecodeError:
        return []
    if not isinstance(saved, dict) or saved.get("settings") != settings:
        print(f"{out} holds another run's settings: measuring every length again")
        return []
    rows = [r for r in saved.get("measured", []) if r.get("tokens") in lengths]
    done = sorted({r["tokens"] for r in rows})
    if done:
        print(f"resuming {out}: keeping the rows of {', '.join(map(str, done))} tokens")
    return rows


def write_result(out: str, result: dict[str, Any]) -> None:
    """Write ``result`` to ``out`` atomically (a temporary file renamed over it)."""
    tmp = Path(f"{out}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE), help="profile for ripplekv")
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="prompt tokens (comma-separated)")
    parser.add_argument("--budgets", default="0.1,0.2,0.3", help="kept fractions (comma-separated)")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"methods, snapkv among them (default {','.join(METHODS)})"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per configuration (median)")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed per configuration")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--skip-memory", action="store_true", help="no peak-memory subprocesses")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1K tokens, 1 repeat, 10%% only")
    parser.add_argument("--out", default=None, help="write every number to this JSON file")
    parser.add_argument("--plots", default=None, help="save PNG plots into this folder")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child_main(json.loads(args.child))
    if args.quick:
        args.lengths, args.repeats, args.budgets = "1024", 1, "0.1"
    lengths = tuple(int(n) for n in args.lengths.split(","))
    budgets = tuple(float(b) for b in args.budgets.split(","))
    methods = method_list(args.methods)
    if "snapkv" not in methods or len(set(methods)) != len(methods):
        parser.error("--methods must name snapkv (every ratio is to it) and no method twice")
    if args.repeats < 1 or args.steps < 1 or any(n < 128 for n in lengths) or not all(0 < b <= 1 for b in budgets):
        parser.error("--repeats and --steps must be >= 1, lengths >= 128 and budgets in (0, 1]")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    profile = SensitivityProfile.load(args.profile)
    configs = configurations(budgets, methods)
    print(
        f"{args.model} ({model.dtype}, {torch.get_num_threads()} threads): {len(configs)} configurations x "
        f"{args.repeats} interleaved rounds at {', '.join(map(str, lengths))} tokens; {args.steps} decoding steps"
    )
    settings = {
        "model": args.model,
        "dtype": str(model.dtype),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "decode_steps": args.steps,
        "budgets": list(budgets),
        "methods": list(methods),
        "profile_sha256": hashlib.sha256(Path(args.profile).read_bytes()).hexdigest(),
        "memory": not args.skip_memory,
    }
    rows = resumed_rows(args.out, settings, lengths)
    for length in lengths:
        if any(r["tokens"] == length for r in rows):
            continue
        ids = prompt_ids(tokenizer, length)
        print(f"{length} tokens: timing", flush=True)
        measured = measure_length(model, tokenizer, ids, configs, profile, args)
        memory: dict[tuple[str, float], dict[str, Any]] = {}
        if not args.skip_memory:
            print(f"{length} tokens: peak memory, one subprocess per configuration", flush=True)
            memory.update({c: peak_memory(args, length, c) for c in configs})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        new = rows_for(length, measured, memory, budgets, args.steps, methods)
        rows += [{**row, "measured_at": stamp} for row in new]
        if args.out:
            write_result(args.out, {"settings": settings, "complete": False, "measured": rows})
    rows.sort(key=lambda r: (lengths.index(r["tokens"]), r["budget"], methods.index(r["method"])))
    print("\nMEASURED (prefill: median of the rounds; held/kept/mask idx: fractions of the full cache's bytes)")
    print_measured(rows)
    worst = None
    for method in [m for m in methods if m not in ("full", "snapkv")]:
        of = [r for r in rows if r["method"] == method]
        ratios = ", ".join(f"{r['tokens'] // 1024}K@{r['budget']:.0%} {r['time_ratio_to_snapkv']:.3f}" for r in of)
        print(f"\n{method} / SnapKV prefill-and-compress time: {ratios}")
        if method == "ripplekv":
            worst = max(r["time_ratio_to_snapkv"] for r in of)
            print(f"worst {worst:.3f} (goal <= {GOAL}): {'met' if worst <= GOAL else 'NOT met'}")
    for method in methods:
        held = sorted({r["held_fraction"] for r in rows if r["method"] == method})
        kept = sorted({r["kept_fraction"] for r in rows if r["method"] == method})
        print(f"  {method:10s} held fraction {held}  kept fraction {kept}")
    computed = computed_kv_table(PUBLISHED, COMPUTED_LENGTHS, COMPUTED_BUDGETS, BF16_BYTES)
    print_computed(computed)
    result = {
        "settings": settings,
        "complete": True,
        "model": args.model,
        "dtype": str(model.dtype),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "decode_steps": args.steps,
        "lengths": list(lengths),
        "budgets": list(budgets),
        "goal_ripplekv_time_ratio": GOAL,
        "worst_ripplekv_time_ratio": worst,
        "measured": rows,
        "computed": {"note": "computed from config.json fields, bf16, not measured", "rows": computed},
    }
    if args.out:
        write_result(args.out, result)
        print(f"wrote {args.out}")
    if args.plots:
        for path in save_plots(rows, Path(args.plots), budgets, methods):
            print(f"saved {path}")


if __name__ == "__main__":
    main()
