"""Child process of the engine tests: stock vLLM's greedy generation (run with ``VLLM_PLUGINS=""``).

Reads ``{"model_dir", "prompts", "max_tokens", "engine"}`` as JSON on stdin and prints, as the last line of stdout,
one ``{"tokens": [...], "logprobs": [...]}`` per prompt.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    """Serve the job's prompts as one batch and print the greedy tokens and their log-probabilities."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    job = json.loads(sys.stdin.read())
    llm = LLM(model=job["model_dir"], **job["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], logprobs=0, ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
    rows = []
    for output in outputs:
        completion = output.outputs[0]
        logprobs = [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)]
        rows.append({"tokens": list(completion.token_ids), "logprobs": logprobs})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
