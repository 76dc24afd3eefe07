"""Helpers of the engine tests: building engines, driving them step by step, stock vLLM and a transformers reference.

Every engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by ``conftest.py``), so the
scheduler's block pool and per-request blocks can be read between steps. Stock vLLM runs in a child process with
``VLLM_PLUGINS=""``, since the installed plugin registers its backend in every process vLLM starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 2048,
    "max_num_batched_tokens": 2048,
    "enforce_eager": True,
    "seed": 0,
    "enable_prefix_caching": False,
    "enable_chunked_prefill": False,
    "block_size": 32,
}
"""Engine settings shared by the plugin and the stock runs (the plugin's required ones included)."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_tiny(model_dir: str, out: Path, model: Any) -> str:
    """Save a random-weight model in float32 with the SmolLM2 tokenizer's files beside it; returns the directory."""
    model.to(torch.float32).eval().save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(model_dir) / name, out / name)
    return str(out)


def ripple_llm(model_dir: str, settings: dict[str, Any], **engine: Any) -> Any:
    """An in-process ``vllm.LLM`` serving with the plugin, configured as a user does: ``additional_config`` alone
    (the plugin's platform selects its worker).

    Args:
        model_dir: the model directory.
        settings: ``additional_config["ripplekv"]``.
        engine: engine arguments overriding :data:`ENGINE_ARGS`.
    """
    from vllm import LLM

    import ripplekv_vllm

    ripplekv_vllm.register()
    return LLM(
        model=model_dir,
        additional_config={"ripplekv": settings},
        **{**ENGINE_ARGS, **engine},
    )


def close(llm: Any) -> None:
    """Shut an in-process engine down (its KV cache is freed once the object goes)."""
    llm.llm_engine.engine_core.shutdown()


def core_of(llm: Any) -> Any:
    """The in-process engine core (scheduler, executor)."""
    return llm.llm_engine.engine_core.engine_core


def runner_of(llm: Any) -> Any:
    """The worker's model runner."""
    return core_of(llm).model_executor.driver_worker.worker.model_runner


@dataclass
class Generation:
    """One request's greedy tokens and their log-probabilities, with its per-step block usage.

    Attributes:
        tokens: the generated token ids.
        logprobs: the log-probability of each generated token.
        blocks: per engine step, the request's block ids of each KV-cache group (null blocks as None).
    """

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    blocks: list[list[list[int | None]]] = field(default_factory=list)


@dataclass
class Run:
    """The requests of one engine run, the free blocks of the pool after each step, and each request's preemptions."""

    requests: dict[str, Generation]
    free_blocks: list[int]
    arrival_steps: dict[str, int]
    preemptions: dict[str, int] = field(default_factory=dict)


def drive(
    llm: Any,
    prompts: dict[str, list[int]],
    max_tokens: int,
    arrivals: dict[str, int] | None = None,
    extra_args: dict[str, dict[str, Any]] | None = None,
) -> Run:
    """Serve ``prompts`` greedily, adding each at its arrival step, recording blocks after every step.

    Args:
        llm: the engine.
        prompts: token ids by request name.
        max_tokens: tokens to generate per request.
        arrivals: the engine step before which each request is added (default: all before the first).
        extra_args: ``SamplingParams.extra_args`` by request name (default: none).
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, core = llm.llm_engine, core_of(llm)
    pool = core.scheduler.kv_cache_manager
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    arrivals = arrivals or {name: 0 for name in prompts}
    run = Run({name: Generation() for name in prompts}, [], {})
    step = 0
    while step == 0 or engine.has_unfinished_requests() or any(s >= step for s in arrivals.values()):
        for name, at in arrivals.items():
            if at == step:
                extra = (extra_args or {}).get(name)
                request_params = params if extra is None else params.clone()
                if extra is not None:
                    request_params.extra_args = extra
                engine.add_request(name, TokensPrompt(prompt_token_ids=prompts[name]), request_params)
                run.arrival_steps[name] = step
        for output in engine.step():
            if output.finished:
                completion = output.outputs[0]
                generation = run.requests[output.request_id]
                generation.tokens = list(completion.token_ids)
                generation.logprobs = [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)]
        for internal, request in core.scheduler.requests.items():
            name = internal.rsplit("-", 1)[0]
            run.preemptions[name] = max(run.preemptions.get(name, 0), request.num_preemptions)
            groups = pool.coordinator.get_blocks(internal)
            run.requests[name].blocks.append([[None if b.is_null else b.block_id for b in group] for group in groups])
        run.free_blocks.append(pool.block_pool.get_num_free_blocks())
        step += 1
    return run


def stock_generate(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[dict[str, list]]:
    """Stock vLLM's greedy tokens and log-probabilities (a child process without the plugin, same engine args).

    Args:
        model_dir: the model directory.
        prompts: token ids of each request, served as one batch.
        max_tokens: tokens to generate per request.
    """
    job = {"model_dir": model_dir, "prompts": prompts, "max_tokens": max_tokens, "engine": ENGINE_ARGS}
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    script = Path(__file__).with_name("stock_generate.py")
    out = subprocess.run(
        [sys.executable, str(script)], input=json.dumps(job), capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def transformers_reference(
    model_dir: str, ids: list[int], kept: dict[int, torch.Tensor], full: dict[int, int], max_tokens: int
) -> tuple[list[int], list[float]]:
    """Greedy decoding by transformers over caches that hold exactly the given kept positions.

    The prompt is prefilled with the whole cache; then each layer ``l`` in ``kept`` keeps, per KV head ``h``, the
    positions ``kept[l][:, h]`` and the tail ``[full[l], N)``, as the plugin's compacted blocks do, and decoding goes
    on at the logical positions ``N, N + 1, ...``.

    Args:
        model_dir: the model directory.
        ids: the prompt.
        kept: per layer index, the kept positions of ``[0, T)``, ``[k, H]``.
        full: per layer index in ``kept``, ``T``.
        max_tokens: tokens to generate.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    n = len(ids)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        cache = out.past_key_values
        for index, layer in enumerate(cache.layers):
            if index not in kept:
                continue
            rows = kept[index].T  # [H, k]
            for name in ("keys", "values"):
                tensor = getattr(layer, name)  # [1, H, N, D]
                picked = tensor[0].gather(1, rows[..., None].expand(-1, -1, tensor.shape[-1]))
                setattr(layer, name, torch.cat([picked[None], tensor[:, :, full[index] : n]], dim=2).contiguous())
        logits = out.logits[0, -1]
        tokens, logprobs = [], []
        for step in range(max_tokens):
            token = int(logits.argmax())
            tokens.append(token)
            logprobs.append(float(logits.log_softmax(-1)[token]))
            if step + 1 == max_tokens:
                break
            out = model(torch.tensor([[token]]), position_ids=torch.tensor([[n + step]]), past_key_values=cache)
            logits = out.logits[0, -1]
    return tokens, logprobs


def spec_of(runner: Any) -> Any:
    """The engine's one ``RippleSpec`` (every layer is in one KV-cache group)."""
    from ripplekv_vllm.spec import RippleSpec

    (group,) = runner.kv_cache_config.kv_cache_groups
    assert isinstance(group.kv_cache_spec, RippleSpec)
    return group.kv_cache_spec


def fractions_of(runner: Any) -> list[tuple[float, list[int]]]:
    """(kept fraction, layer indices) of each budget group of an engine configured with ``keep_fractions``."""
    budgets = spec_of(runner).budgets
    return [(fraction, list(members)) for fraction, members in zip(budgets.fractions, budgets.groups)]


def non_null(blocks: list[list[int | None]]) -> list[int]:
    """Non-null blocks per group."""
    return [sum(b is not None for b in group) for group in blocks]
