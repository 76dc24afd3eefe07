"""What a prefill record holds for ExpectedAttention with and without prescoring, and whether the caches agree.

On SmolLM2-135M (float32, this CPU), for one essay prompt per length, records three ways and compares them side
by side in one run:

* ``all``: the record before prescoring existed, every layer's whole hidden states kept (``hidden_tail=None``),
  one pass;
* ``prescored``: :func:`~ripplekv_eval.fastpath.record.record_prefill` with ``prescore``, the hidden-state tail the
  presses read, one pass;
* ``prescored/chunk=C``: the same in prefill chunks of ``C`` tokens (the query moments merged chunk by chunk);
* ``all/chunk=C``: every hidden state kept, in the same chunks (kvpress's one-pass statistics over the joined
  hidden states): against ``prescored/chunk=C`` it isolates the moments' effect, the two caches being the same.

Per record: ``record.nbytes()`` (the cache, the kept hidden states, the kwargs and the pinned scores) and the
recording time; per press (``snapkv``, ``ripplekv``, ``cake``, ``squeezeattention`` over ExpectedAttention at
20%), whether the derived cache is the ``all`` record's bit for bit (one pass) or keeps the same positions per
layer and head (chunked). Then the computed bytes for Llama-3.1-8B in bf16 at 128K tokens: every layer's hidden
states against the pinned scores.

    PYTHONPATH=src python benchmarks/prescore.py                     # 2048 and 4096 tokens, chunks of 1,024
    PYTHONPATH=src python benchmarks/prescore.py --lengths 1024 --chunk 256 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

METHODS = ("snapkv", "ripplekv", "cake", "squeezeattention")
BUDGET = 0.2
MIB = 2**20


def _kept(record: Any, state: Any) -> list[list[tuple[int, ...]]]:
    """Per layer and KV head, the prompt positions the derived cache keeps (matched by key vector)."""
    found = []
    for full, layer in zip(record.layers, state.cache.layers, strict=True):
        heads = []
        for head in range(full.keys.shape[1]):
            same = (layer.keys[0, head, :, None, :] == full.keys[0, head, None, :, :]).all(-1)
            heads.append(tuple(sorted(same.float().argmax(-1).tolist())))
        found.append(heads)
    return found


def _positions(record: Any, state: Any, reference: Any) -> list[list[tuple[int, ...]]]:
    """Kept positions of ``state`` (derived from ``record``), read against ``reference``'s keys when they differ
    by rounding (a chunked record): the nearest key of the reference's layer."""
    found = []
    for full, mine, layer in zip(reference.layers, record.layers, state.cache.layers, strict=True):
        heads = []
        for head in range(full.keys.shape[1]):
            distance = torch.cdist(layer.keys[0, head].double(), mine.keys[0, head].double())
            heads.append(tuple(sorted(distance.argmin(-1).tolist())))
        found.append(heads)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096", help="prompt lengths in tokens")
    parser.add_argument("--chunk", type=int, default=1024, help="prefill chunk of the chunked record")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's dtype")
    args = parser.parse_args()
    from kvpress import ExpectedAttentionPress
    from transformers.utils import logging as hf_logging

    from ripplekv.models.attention import enable_varlen_attention
    from ripplekv.models.loading import load_model
    from ripplekv.presses.registry import make_press
    from ripplekv.profiling.calibration import default_calibration
    from ripplekv_eval.fastpath.derive import derived_prefill, residual_statistics_of
    from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail, prescored_scorers
    from ripplekv_eval.fastpath.record import record_prefill

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model("smollm2-135m", dtype=args.dtype)
    enable_varlen_attention(model)
    profile = "benchmarks/results/smollm2-135m.profile.json"
    presses = {m: make_press(m, budget=BUDGET, profile=profile, scorer=ExpectedAttentionPress()) for m in METHODS}
    prescore = prescored_scorers(presses.values())
    everything = [*presses.values(), make_press("full")]
    tail = hidden_states_tail(everything, prescore)
    statistics = residual_statistics_of(presses.values())
    print(
        f"{args.dtype}; prescored: {[type(s).__name__ for s in prescore]}; hidden-state tail kept: {tail} positions "
        "per layer"
    )
    for length in (int(x) for x in args.lengths.split(",")):
        text = (
            default_calibration(tokenizer, n_samples=1, context_tokens=length, continuation_tokens=1).samples[0].context
        )
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"][:length]])
        records = {}
        for name, kwargs in (
            ("all", {"hidden_tail": None, "prefill_chunk": None}),
            ("prescored", {"hidden_tail": tail, "prefill_chunk": None, "prescore": prescore}),
            (f"prescored/chunk={args.chunk}", {"hidden_tail": tail, "prefill_chunk": args.chunk, "prescore": prescore}),
            (f"all/chunk={args.chunk}", {"hidden_tail": None, "prefill_chunk": args.chunk}),
        ):
            start = time.perf_counter()
            records[name] = record_prefill(model, ids, residual_statistics=statistics, **kwargs)
            seconds = time.perf_counter() - start
            record = records[name]
            print(
                f"{ids.shape[1]:>5} tokens  {name:<22} record {record.nbytes() / MIB:8.1f} MiB "
                f"({record.nbytes() / records['all'].nbytes():.3f} of all)  hidden states kept "
                f"{record.hidden_tokens:>5}  {seconds:5.1f} s"
            )
        reference = records["all"]
        for method, press in presses.items():
            want, _ = derived_prefill(reference, press)
            want_kept = _kept(reference, want)
            verdicts = []
            for name, record in list(records.items())[1:3]:
                got, _ = derived_prefill(record, press)
                if name == "prescored":
                    same = all(
                        torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                        for a, b in zip(want.cache.layers, got.cache.layers, strict=True)
                    )
                    verdicts.append(f"{name}: {'bit for bit' if same else 'DIFFERENT'}")
                else:
                    kept = _positions(record, got, reference)
                    pairs = [(set(a), set(b)) for la, lb in zip(want_kept, kept) for a, b in zip(la, lb)]
                    changed = sum(len(a ^ b) // 2 for a, b in pairs)
                    total = sum(len(a) for a, _ in pairs)
                    verdicts.append(f"{name}: {changed} of {total} kept positions differ")
            # the prescoring alone: the chunked records share their cache bit for bit, so positions match exactly
            chunked, plain = records[f"prescored/chunk={args.chunk}"], records[f"all/chunk={args.chunk}"]
            a, _ = derived_prefill(chunked, press)
            b, _ = derived_prefill(plain, press)
            pairs = [(set(x), set(y)) for lx, ly in zip(_kept(chunked, a), _kept(plain, b)) for x, y in zip(lx, ly)]
            changed = sum(len(x ^ y) // 2 for x, y in pairs)
            verdicts.append(f"moments vs every hidden state, both chunked: {changed} differ")
            print(f"      {method:<17} " + "; ".join(verdicts))
    layers, kv_heads, hidden, tokens, bf16 = 32, 8, 4096, 128 * 1024, 2
    every = layers * tokens * hidden * bf16
    scores = layers * kv_heads * tokens * bf16
    print(
        f"Llama-3.1-8B, bf16, 128K tokens: every layer's hidden states {every / 2**30:.1f} GiB; pinned "
        f"ExpectedAttention scores {scores / MIB:.0f} MiB ({every / scores:.0f}x less)"
    )


if __name__ == "__main__":
    main()
