"""The paper's efficiency table on a GPU: a RANDOM-weight Llama-3.1-8B (bf16, sdpa) at 32K and 128K tokens.

Run by ``benchmarks/gpu/check.sh`` (which installs the pinned wheels and runs the gpu tests first); see
``benchmarks/gpu/README.md``. The model is built from ``configs/llama-3.1-8b.json`` (the published config.json of
meta-llama/Llama-3.1-8B-Instruct) directly on the GPU with random weights (transformers' own init, normal with
std 0.02): prefill time, decoding time and memory depend on the shapes, not on the weights' values. The prompts
are random token ids.

The measurement is ``benchmarks/efficiency.py``'s (:func:`benchmarks.efficiency.measure_length`, the same rows),
which synchronises the device around every timing and reads the CUDA allocator's peak per configuration:

* configurations: ``full`` and SnapKV, PyramidKV, AdaKV, RippleKV at each budget (10/20/30%);
* **prefill-and-compress seconds** (``prefill(model, ids, press)``, one forward pass with the press's hooks) and
  its ratio to SnapKV's at the same length and budget (goal: RippleKV <= 1.02); repeats per length (``--repeats``,
  2 at 32K, 1 at 128K by default), after an untimed full prefill at that length and a warm-up of every configuration at
  ``--warmup-tokens`` (its numbers are not reported);
* **decoding ms per token** over the compressed cache (``--steps`` one-token passes, stop tokens banned);
* **peak GPU memory**: ``torch.cuda.max_memory_allocated``, reset before each configuration's prefill; the
  ``before`` bytes are the weights and what the runtime holds, ``prefill_peak`` the prefill's peak, ``peak`` that of
  prefill + decoding (decoding runs over a fork of the prompt's cache, so the cache is held twice then);
* the bytes the compressed cache holds against the full cache's (held / kept fractions, AdaKV's mask indices).

RippleKV's profile is SYNTHETIC (a deterministic score vector for the 32 layers, tied to the model with
:func:`ripplekv.models.model_identity`): enough for time and memory, which depend on the per-layer budgets it sets,
not on what the scores mean. The JSON says so.

A length whose predicted cost (extrapolated from the lengths measured before it) does not fit in what is left of
``--deadline-s`` runs with fewer repeats, or is skipped with the reason in ``skipped``. The JSON is rewritten after
every length (``"complete": false`` until the end), so a run stopped from outside keeps what it measured.

``--dry-run``: the same pipeline on a tiny random Llama (``configs/tiny-llama.json``, 2 layers, hidden 64) on the
CPU at 256 and 512 tokens, writing the same schema in seconds (the CI self-check, ``tests/test_gpu_check.py``).

    python -m benchmarks.gpu.efficiency_gpu --out DIR                # on a GPU machine (check.sh does this)
    python -m benchmarks.gpu.efficiency_gpu --dry-run --out /tmp/x   # CPU self-check
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from benchmarks.efficiency import (
    GOAL,
    configurations,
    decode_seconds,
    measure_length,
    print_measured,
    rows_for,
    write_result,
)
from benchmarks.kv_accounting import synchronize
from ripplekv.inference.generate import prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.identity import model_identity
from ripplekv.profiling.profile import SensitivityProfile

SCHEMA = "ripplekv-gpu-check/1"
RESULT_NAME = "gpu-check.json"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIGS = HERE / "configs"
FULL_CONFIG = CONFIGS / "llama-3.1-8b.json"
TINY_CONFIG = CONFIGS / "tiny-llama.json"
MIB = 2**20
GIB = 2**30

# The GPU run: the paper's lengths and budgets; 2 timed rounds at 32K (~1-2 s a prefill), 1 at 128K (~15-25 s).
GPU_DEFAULTS = {"lengths": "32768,131072", "repeats": "2,1", "warmup_tokens": 4096, "steps": 16, "deadline_s": 330.0}
DRY_DEFAULTS = {"lengths": "256,512", "repeats": "2,1", "warmup_tokens": 128, "steps": 4, "deadline_s": 120.0}
ROW_KEYS = (
    "tokens",
    "budget",
    "method",
    "attn_implementation",
    "prefill_s",
    "prefill_s_all",
    "time_ratio_to_snapkv",
    "decode_ms_per_step",
    "held_fraction",
    "kept_fraction",
    "held_bytes",
    "mask_index_bytes",
    "full_bytes",
    "kept_tokens",
    "gpu_before_mib",
    "gpu_prefill_peak_mib",
    "gpu_peak_mib",
    "gpu_peak_over_model_mib",
    "measured_at",
)
"""Every row holds these keys (the GPU memory ones are null off CUDA)."""

METHODS = ("full", "snapkv", "pyramidkv", "adakv", "ripplekv")
"""The methods timed on the GPU: the paper's efficiency set (the per-prompt schedules of the CPU benchmark would not fit
the device's 15 minutes at 128K tokens)."""


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and the device: what the numbers were measured with."""
    import kvpress
    import transformers

    import ripplekv

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "transformers_path": str(Path(transformers.__file__).parent),
        "kvpress": _version("kvpress"),
        "kvpress_path": str(Path(kvpress.__file__).parent),
        "tokenizers": _version("tokenizers"),
        "ripplekv": ripplekv.__version__,
        "ripplekv_path": str(Path(ripplekv.__file__).parent),
        "git_commit": _git_commit(),
        "flash_attn": _version("flash_attn") or _version("flash-attn"),
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu_name": None,
        "gpu_memory_bytes": None,
        "gpu_capability": None,
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu_name=props.name,
            gpu_memory_bytes=int(props.total_memory),
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_multiprocessors=int(props.multi_processor_count),
            sdpa_flash=torch.backends.cuda.flash_sdp_enabled(),
            sdpa_mem_efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
            sdpa_cudnn=torch.backends.cuda.cudnn_sdp_enabled(),
        )
    return env


def build_model(config_path: Path, device: torch.device, dtype: torch.dtype, attn: str) -> LlamaForCausalLM:
    """A random-weight model of ``config_path``, created on ``device`` (no copy of the weights through the CPU)."""
    config = LlamaConfig.from_json_file(str(config_path))
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype, attn_implementation=attn)
    model = model.to(device).eval()  # a no-op when the weights were created there
    model.requires_grad_(False)
    return model


def synthetic_profile(model: LlamaForCausalLM) -> SensitivityProfile:
    """A deterministic profile of ``model``'s layers: the early layers most sensitive, a slight rise at the end.

    For timing only: the scores set RippleKV's per-layer budgets (which the cost depends on), they were not measured.
    """
    layers = model.config.num_hidden_layers
    scores = tuple(
        round(0.02 + 0.5 * math.exp(-3.0 * i / layers) + 0.05 * (i / max(layers - 1, 1)) ** 2, 6) for i in range(layers)
    )
    return SensitivityProfile(
        model=model_identity(model),
        scores=scores,
        sample_scores=(scores,),
        local_scores=scores,
        alpha=0.5,
        repeats=1,
        seed=0,
        calibration={"description": "SYNTHETIC: deterministic score vector for timing (benchmarks/gpu), not measured"},
        library_version="benchmarks/gpu",
        created="2026-01-01T00:00:00+00:00",
    )


def random_prompt(length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + length)
    return torch.randint(0, vocab, (1, length), generator=generator)


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def gpu_rows(length: int, measured: dict, budgets: tuple[float, ...], steps: int, attn: str) -> list[dict]:
    """``benchmarks.efficiency.rows_for``'s rows with the GPU allocator's bytes added (null off CUDA)."""
    rows = []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for row in rows_for(length, measured, {}, budgets, steps, METHODS):
        config = ("full", 1.0) if row["method"] == "full" else (row["method"], row["budget"])
        memory = measured["device_memory"].get(config, {})
        before, peak = memory.get("before"), memory.get("peak")
        row.update(
            attn_implementation=attn,
            gpu_before_mib=_mib(before),
            gpu_prefill_peak_mib=_mib(memory.get("prefill_peak")),
            gpu_peak_mib=_mib(peak),
            gpu_peak_over_model_mib=_mib(None if peak is None else peak - before),
            measured_at=stamp,
        )
        rows.append({key: row[key] for key in ROW_KEYS})
    return rows


def _fit(points: list[tuple[int, float]], length: int, power: int) -> float:
    """``a * n + b * n**power`` through the last two points (both coefficients >= 0), else scaled by ``n**power``."""
    n1, t1 = points[-1]
    scaled = t1 * (length / n1) ** power
    if len(points) < 2 or points[-2][0] == n1:
        return scaled
    n0, t0 = points[-2]
    b = (t1 / n1 - t0 / n0) / (n1 ** (power - 1) - n0 ** (power - 1)) if power > 1 else 0.0
    a = t1 / n1 - b * n1 ** (power - 1)
    return a * length + b * length**power if a >= 0 and b >= 0 else scaled


def predicted_seconds(history: list[dict[str, float]], length: int, configs: int, repeats: int) -> float:
    """Predicted wall time of ``measure_length`` at ``length`` (no warm-up) from the lengths measured before it.

    ``history`` holds, per measured length, ``tokens``, ``prefill`` (seconds of one full-cache prefill) and
    ``decode`` (seconds of its timed decoding). A prefill is fitted as ``a * n + b * n**2`` through the last two
    lengths (linear layers, quadratic attention), a decoding as ``a + b * n`` (weights, then the cache); one length
    runs every configuration ``repeats`` times, each a prefill and a decoding (the full cache's, the costliest),
    plus 5% for the presses and the bookkeeping.
    """
    if not history:
        return 0.0
    prefills = [(h["tokens"], h["prefill"]) for h in history]
    n1, d1 = history[-1]["tokens"], history[-1]["decode"]
    decode = d1 * max(1.0, length / n1)
    if len(history) >= 2 and history[-2]["tokens"] != n1:
        n0, d0 = history[-2]["tokens"], history[-2]["decode"]
        slope = max(0.0, (d1 - d0) / (n1 - n0))
        decode = max(d1, d1 + slope * (length - n1))
    return 1.05 * configs * repeats * (_fit(prefills, length, 2) + decode)


def plan_length(
    history: list[dict[str, float]], length: int, budgets: tuple[float, ...], repeats: int, left: float
) -> tuple[int, tuple[float, ...], float] | None:
    """The most repeats, then the most budgets (the first ones, one round), predicted to fit in ``left`` seconds.

    Returns ``(repeats, budgets, predicted seconds)``, or None where even the first budget alone does not fit.
    """
    configs = len(configurations(budgets, METHODS))
    for rounds in range(repeats, 0, -1):
        predicted = predicted_seconds(history, length, configs, rounds)
        if predicted <= left:
            return rounds, budgets, predicted
    for keep in range(len(budgets) - 1, 0, -1):
        predicted = predicted_seconds(history, length, len(configurations(budgets[:keep], METHODS)), 1)
        if predicted <= left:
            return 1, budgets[:keep], predicted
    return None


def pytest_summary(junit: str | os.PathLike[str], returncode: int | None = None) -> dict[str, Any]:
    """Counts and the failed or skipped tests (with their messages) of a pytest ``--junitxml`` report."""
    import xml.etree.ElementTree as ET

    path = Path(junit)
    if not path.exists():
        return {"ran": True, "returncode": returncode, "error": f"no junit report at {path.name}"}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {
        key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")
    }
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome, message = tag, (found.get("message") or found.text or "")[:600]
                break
        cases.append(
            {
                "test": f"{case.get('classname')}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0)),
                **({"message": message} if message else {}),
            }
        )
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"ran": True, "returncode": returncode, **counts, "passed": passed, "cases": cases}


def summary(rows: list[dict]) -> dict[str, Any]:
    ripple = [r for r in rows if r["method"] == "ripplekv"]
    worst = max((r["time_ratio_to_snapkv"] for r in ripple), default=None)
    by_length: dict[str, Any] = {}
    for tokens in sorted({r["tokens"] for r in rows}):
        sub = [r for r in ripple if r["tokens"] == tokens]
        by_length[str(tokens)] = {
            "ripplekv_time_ratio": {f"{r['budget']:g}": r["time_ratio_to_snapkv"] for r in sub},
            "worst": max(r["time_ratio_to_snapkv"] for r in sub),
        }
    return {
        "goal_ripplekv_time_ratio": GOAL,
        "worst_ripplekv_time_ratio": worst,
        "goal_met": None if worst is None else worst <= GOAL,
        "by_length": by_length,
    }


def print_memory(rows: list[dict]) -> None:
    if not any(r["gpu_peak_mib"] is not None for r in rows):
        return
    print("\nGPU memory (torch.cuda.max_memory_allocated, GiB; reset per configuration)")
    print("| tokens | budget | method | before (weights) | prefill peak | prefill+decode peak | over model |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        cells = [r[k] / 1024 for k in ("gpu_before_mib", "gpu_prefill_peak_mib", "gpu_peak_mib")]
        over = r["gpu_peak_over_model_mib"] / 1024
        print(
            f"| {r['tokens']} | {r['budget']:.0%} | {r['method']} | "
            + " | ".join(f"{c:.2f}" for c in cells)
            + f" | {over:.2f} |"
        )


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU self-check on a tiny model at small lengths")
    parser.add_argument("--config", default=None, help="model config.json (default: the 8B's; tiny with --dry-run)")
    parser.add_argument("--lengths", default=None, help="prompt tokens, comma-separated (default 32768,131072)")
    parser.add_argument("--repeats", default=None, help="timed rounds per length, comma-separated (default 2,1)")
    parser.add_argument("--budgets", default="0.1,0.2,0.3")
    parser.add_argument("--steps", type=int, default=None, help="decoding steps timed per configuration (16)")
    parser.add_argument("--warmup-tokens", type=int, default=None, help="untimed warm-up of every configuration")
    parser.add_argument("--deadline-s", type=float, default=None, help="seconds this script may run (330)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 with --dry-run)")
    parser.add_argument("--pytest-junit", default=None, help="junit XML of the gpu tests, summarised into the JSON")
    parser.add_argument("--pytest-rc", type=int, default=None, help="the gpu tests' exit status")
    parser.add_argument("--pytest-skipped", default=None, help="why the gpu tests did not run (into the JSON)")
    parser.add_argument("--out", required=True, help=f"folder for {RESULT_NAME}")
    args = parser.parse_args(argv)
    started = time.monotonic()
    defaults = DRY_DEFAULTS if args.dry_run else GPU_DEFAULTS
    lengths = _ints(args.lengths or defaults["lengths"])
    repeats = _ints(args.repeats or defaults["repeats"])
    repeats = repeats + (repeats[-1],) * (len(lengths) - len(repeats))
    budgets = tuple(float(b) for b in args.budgets.split(","))
    steps = args.steps or defaults["steps"]
    warmup = args.warmup_tokens or defaults["warmup_tokens"]
    deadline = args.deadline_s or defaults["deadline_s"]
    config_path = Path(args.config) if args.config else (TINY_CONFIG if args.dry_run else FULL_CONFIG)
    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    threads = args.threads or (1 if args.dry_run else None)
    if threads:
        torch.set_num_threads(threads)  # a tiny model runs fastest on one thread (much faster on a busy machine)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = str(out_dir / RESULT_NAME)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    result: dict[str, Any] = {
        "schema": SCHEMA,
        "dry_run": args.dry_run,
        "complete": False,
        "skipped_reason": None,
        "environment": environment(device) if device.type != "cuda" or torch.cuda.is_available() else {},
        "pytest": (
            pytest_summary(args.pytest_junit, args.pytest_rc)
            if args.pytest_junit
            else {"ran": False, "reason": args.pytest_skipped or "not run"}
        ),
    }
    if device.type == "cuda" and not torch.cuda.is_available():
        result.update(complete=True, skipped_reason="no CUDA GPU on this machine: nothing measured (try --dry-run)")
        result["environment"] = environment(torch.device("cpu"))
        write_result(out, result)
        print(f"SKIPPED: {result['skipped_reason']}; wrote {out}")
        return 0

    dtype = torch.bfloat16
    build_start = time.perf_counter()
    model = enable_varlen_attention(build_model(config_path, device, dtype, "sdpa"))
    build_s = time.perf_counter() - build_start
    parameters = sum(p.numel() for p in model.parameters())
    profile = synthetic_profile(model)
    configs = configurations(budgets, METHODS)
    result.update(
        model={
            "config": str(config_path.relative_to(REPO)) if config_path.is_relative_to(REPO) else str(config_path),
            "name": "Llama-3.1-8B-Instruct architecture" if config_path == FULL_CONFIG else config_path.stem,
            "weights": "RANDOM (transformers' init: normal, std 0.02), created on the device; prompts: random ids",
            "dtype": str(dtype).removeprefix("torch."),
            "parameters": parameters,
            "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "attn_implementation": model.config._attn_implementation,
            "attn_note": "sdpa through ripplekv's variable-length wrapper (ripplekv_sdpa), which PyramidKV and "
            "RippleKV need for per-layer cache lengths; prefill runs sdpa with is_causal (no materialised mask)",
            "build_s": round(build_s, 2),
        },
        profile={
            "synthetic": True,
            "note": "deterministic score vector for timing, NOT measured on this model: time and memory depend on "
            "the per-layer budgets it sets (see each row's kept_tokens), not on what the scores mean",
            "scores": list(profile.scores),
        },
        settings={
            "lengths": list(lengths),
            "repeats": list(repeats),
            "budgets": list(budgets),
            "methods": list(METHODS),
            "configurations": len(configs),
            "decode_steps": steps,
            "warmup_tokens": warmup,
            "deadline_s": deadline,
        },
        flash_attention_2={
            "measured": False,
            "reason": "not measured: ripplekv's variable-length attention (needed by PyramidKV's and RippleKV's "
            "per-layer cache lengths) wraps sdpa and eager only"
            + ("" if result["environment"].get("flash_attn") else "; flash_attn is not installed either"),
        },
        rows=[],
        skipped=[],
    )
    print(
        f"{result['model']['name']}: {parameters / 1e9:.2f}B parameters ({result['model']['dtype']}) built on "
        f"{device} in {build_s:.1f} s; {len(configs)} configurations at {', '.join(map(str, lengths))} tokens",
        flush=True,
    )

    # measure_length collects garbage before each prefill: with torch and transformers loaded a full collection takes
    # ~0.5 s here; freezing what exists now (modules, the model) leaves only the run's own objects to collect
    gc.collect()
    gc.freeze()
    vocab = model.config.vocab_size
    history: list[dict[str, float]] = []

    def record(tokens: int, measured: dict) -> None:
        full = ("full", 1.0)
        history.append(
            {
                "tokens": tokens,
                "prefill": statistics.median(measured["times"][full]),
                "decode": statistics.median(measured["decodes"][full]),
            }
        )

    warm_start = time.perf_counter()
    warm_args = SimpleNamespace(repeats=1, steps=steps)
    record(warmup, measure_length(model, None, random_prompt(warmup, vocab), configs, profile, warm_args))
    # a second point for the prediction of the first length: one full prefill and decoding at twice the warm-up
    probe = random_prompt(2 * warmup, vocab)
    synchronize(device)
    probe_start = time.perf_counter()
    state = prefill(model, probe)
    synchronize(device)
    probe_prefill = time.perf_counter() - probe_start
    history.append(
        {"tokens": 2 * warmup, "prefill": probe_prefill, "decode": decode_seconds(model, state, steps, set())}
    )
    del state
    result["warmup"] = {"tokens": warmup, "seconds": round(time.perf_counter() - warm_start, 2), "history": history}
    print(f"warm-up of every configuration at {warmup} tokens: {result['warmup']['seconds']} s (not reported)")
    for length, rounds in zip(lengths, repeats):
        left = deadline - (time.monotonic() - started)
        plan = plan_length(history, length, budgets, rounds, left)
        if plan is None:
            predicted = predicted_seconds(history, length, len(configs), 1)
            reason = f"predicted {predicted:.0f} s for {length} tokens, {left:.0f} s left of --deadline-s {deadline:g}"
            result["skipped"].append({"tokens": length, "reason": reason})
            print(f"SKIPPING {length} tokens: {reason}", flush=True)
            continue
        planned, planned_budgets, predicted = plan
        notes = []
        if planned != rounds:
            notes.append(f"repeats cut from {rounds} to {planned}")
        if planned_budgets != budgets:
            notes.append(f"budgets cut to {', '.join(f'{b:.0%}' for b in planned_budgets)}")
            result["skipped"].append({"tokens": length, "reason": "; ".join(notes) + " to fit the deadline"})
        note = f" ({'; '.join(notes)} to fit the deadline)" if notes else ""
        print(f"{length} tokens: {planned} round(s), predicted {predicted:.0f} s{note}", flush=True)
        length_start = time.perf_counter()
        # No untimed prefill first: the warm-up ran every configuration, and at each length the full cache (not in
        # the RippleKV / SnapKV ratio) runs first, meeting the new shapes.
        measured = measure_length(
            model,
            None,
            random_prompt(length, vocab),
            configurations(planned_budgets, METHODS),
            profile,
            SimpleNamespace(repeats=planned, steps=steps),
            warmup=False,
        )
        seconds = time.perf_counter() - length_start
        record(length, measured)
        result["rows"] += gpu_rows(length, measured, planned_budgets, steps, "sdpa")
        result.setdefault("length_seconds", {})[str(length)] = {
            "measured": round(seconds, 2),
            "predicted": round(predicted, 2),
            "repeats": planned,
        }
        result.update(summary(result["rows"]))
        write_result(out, result)
        print(f"{length} tokens done in {seconds:.1f} s (predicted {predicted:.0f} s)", flush=True)

    result["complete"] = not result["skipped"]
    result["total_s"] = round(time.monotonic() - started, 2)
    result.update(summary(result["rows"]))
    write_result(out, result)
    print("\nMEASURED (prefill: median of the rounds; held/kept/mask idx: fractions of the full cache's bytes)")
    print_measured(result["rows"])
    print_memory(result["rows"])
    worst = result["worst_ripplekv_time_ratio"]
    if worst is not None:
        print(f"\nRippleKV / SnapKV prefill-and-compress time, worst {worst:.3f} (goal <= {GOAL}): ", end="")
        print("met" if result["goal_met"] else "NOT met")
    for skipped in result["skipped"]:
        print(f"skipped {skipped['tokens']} tokens: {skipped['reason']}")
    print(f"total {result['total_s']:.1f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
