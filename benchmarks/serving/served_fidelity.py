"""Served fidelity: the library's prompts and full-cache answers, teacher-forced through the vLLM plugin (issue 43,
item 2). Run in the vLLM environment, after ``granularity.py`` (main environment) wrote ``answers.jsonl``:

    .venv-vllm/bin/python benchmarks/serving/served_fidelity.py --answers DIR/answers.jsonl --model-dir M \
        --profile P --out OUT

Every configuration serves all the prompts at once in a fresh engine process (float32, eager, 32-token blocks, the
plugin's required settings), each request forced along the library's full-cache answer
(:class:`ripplekv_vllm.fidelity.TeacherForcing`):

* ``full``: stock vLLM, recording each answer token's distribution (the engine's own full-cache reference);
* ``snapkv-B``: the plugin with one kept fraction ``B`` in every layer (SnapKV-uniform);
* ``ripplekv-B`` (and ``ripplekv-B@rR,gG`` for each extra ``--settings``): the plugin with the profile's budgets,
  one KV-cache group per layer; ``ripplekv-B-gG``: in G tiers (``--groups``).

Each compressed request's KL(full || compressed) per answer token against the engine's full-cache row, and its top-1
agreement with the forced token. ``OUT/<config>.json`` is written when a configuration finishes: re-running skips it
(without ``full.json`` the others must go too; the references live in ``--fidelity-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 32
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: vLLM's CPU worker otherwise reserves most of the memory


def read_answers(path: Path) -> dict[int, dict[str, Any]]:
    """The library's prompts and answers by prompt index (the last line of an index wins)."""
    out: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out[int(row["prompt"])] = row
    return dict(sorted(out.items()))


def configs(args: argparse.Namespace) -> list[str]:
    """``full``, then SnapKV-uniform and RippleKV (each setting, each ``--groups``) at each budget."""
    out = ["full"]
    for budget in args.budgets:
        out.append(f"snapkv-{budget:g}")
        for ratio, gamma in args.settings:
            tag = "" if (ratio, gamma) == (4.0, 3.0) else f"@r{ratio:g},g{gamma:g}"
            for groups in args.groups:
                out.append(f"ripplekv-{budget:g}{'' if groups == 'layer' else f'-g{groups}'}{tag}")
    return out


def settings_of(config: str, args: argparse.Namespace, layers: int) -> dict[str, Any] | None:
    """``additional_config["ripplekv"]`` of a configuration (None: stock vLLM)."""
    if config == "full":
        return None
    method, rest = config.split("-", 1)
    rest, _, tag = rest.partition("@")
    budget_text, _, groups = rest.partition("-g")
    budget = float(budget_text)
    if method == "snapkv":
        return {"keep_fractions": [budget] * layers}
    settings: dict[str, Any] = {"profile": str(args.profile), "budget": budget, "groups": int(groups or 0) or "layer"}
    if tag:
        ratio, gamma = (float(part[1:]) for part in tag.split(","))
        settings.update(ratio=ratio, gamma=gamma)
    return settings


def child(args: argparse.Namespace) -> None:
    """Serve every prompt under ``args.config`` and write ``OUT/<config>.json``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from ripplekv_vllm.fidelity import TeacherForcing, force_args, read_forced, record_args
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    answers = read_answers(args.answers)
    longest = max(len(row["prompt_ids"]) + len(row["answer"]) for row in answers.values())
    max_model_len = -(-(longest + 1) // BLOCK) * BLOCK
    engine: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "seed": 0,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "block_size": BLOCK,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": max_model_len + len(answers),
        "max_num_seqs": len(answers),
        "kv_cache_memory_bytes": args.kv_mib * 2**20,
        "logits_processors": [TeacherForcing],
    }
    layers = json.loads((Path(args.model_dir) / "config.json").read_text())["num_hidden_layers"]
    settings = settings_of(args.config, args, layers)
    if settings is not None:
        import ripplekv_vllm

        ripplekv_vllm.register()
        engine.update(worker_cls=ripplekv_vllm.WORKER_CLS, additional_config={"ripplekv": settings})
    llm = LLM(model=args.model_dir, **engine)
    reference = args.fidelity_dir / "full"
    results = args.fidelity_dir / args.config
    requests = {}
    for index, row in answers.items():
        name = f"p{index}"
        extra = (
            record_args(name, reference, row["answer"])
            if settings is None
            else force_args(name, reference, results, row["answer"])
        )
        params = SamplingParams(temperature=0.0, max_tokens=len(row["answer"]), ignore_eos=True, extra_args=extra)
        llm.llm_engine.add_request(name, TokensPrompt(prompt_token_ids=row["prompt_ids"]), params)
        requests[name] = index
    started = time.perf_counter()
    served: dict[str, list[int]] = {}
    while llm.llm_engine.has_unfinished_requests():
        for out in llm.llm_engine.step():
            if out.finished:
                served[out.request_id] = list(out.outputs[0].token_ids)
    seconds = time.perf_counter() - started
    rows: dict[str, Any] = {}
    for name, index in requests.items():
        if served[name] != answers[index]["answer"]:
            raise SystemExit(f"{name}: the engine did not emit the forced answer")
        if settings is None:
            continue
        kl, top1 = read_forced(results, name)
        answer = np.asarray(answers[index]["answer"])
        rows[str(index)] = {"kl": float(np.mean(kl)), "top1": float(np.mean(top1 == answer)), "kl_tokens": kl.tolist()}
    payload = {"config": args.config, "settings": settings, "seconds": seconds, "prompts": len(requests), "rows": rows}
    (args.out / f"{args.config}.json").write_text(json.dumps(payload) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, required=True, help="granularity.py's answers.jsonl")
    parser.add_argument("--model-dir", required=True, help="the library's converted model directory")
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--settings", nargs="+", default=["4,3"], help="RippleKV r,gamma pairs (default 4,3)")
    parser.add_argument("--groups", nargs="+", default=["layer"], help="RippleKV's groups: 'layer' or tier counts")
    parser.add_argument("--kv-mib", type=int, default=2048, help="KV-cache MiB of every engine")
    parser.add_argument("--fidelity-dir", type=Path, default=None, help="the recorded references (default: a temp)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    args.settings = [tuple(float(v) for v in s.split(",")) for s in args.settings]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.config is not None:
        child(args)
        return
    fidelity_dir = args.fidelity_dir or Path(tempfile.gettempdir()) / f"ripplekv-served-fidelity-{args.out.name}"
    recorded = [fidelity_dir / "full" / f"p{index}.npy" for index in read_answers(args.answers)]
    if not (args.out / "full.json").exists() or not all(path.exists() for path in recorded):
        for stale in args.out.glob("*.json"):
            stale.unlink()  # the compressed rows compare with the full run's references (gone on a new machine)
    for config in configs(args):
        if (args.out / f"{config}.json").exists():
            print(f"{config}: done", flush=True)
            continue
        argv = [sys.executable, __file__, "--config", config, "--fidelity-dir", str(fidelity_dir)]
        argv += ["--answers", str(args.answers), "--model-dir", args.model_dir, "--profile", str(args.profile)]
        argv += ["--out", str(args.out), "--kv-mib", str(args.kv_mib), "--budgets", *map(str, args.budgets)]
        argv += ["--settings", *(f"{r:g},{g:g}" for r, g in args.settings), "--groups", *args.groups]
        tick = time.perf_counter()
        subprocess.run(argv, check=True)
        print(f"{config}: {time.perf_counter() - tick:.0f} s", flush=True)


if __name__ == "__main__":
    main()
