"""Teacher-forced fidelity of served requests: a vLLM logits processor recording or comparing each token's distribution.

The fidelity of a compressed cache is measured as the library does (RippleKV, Xu et al., 2026): KL(full || compressed)
per generated token, with the compressed model teacher-forced along the full cache's answer. In vLLM the measured
request is a request served under load like any other: :class:`TeacherForcing`, passed to the engine as
``LLM(logits_processors=[TeacherForcing])``, sees every step's logits before sampling and acts on the requests whose
``SamplingParams.extra_args[KEY]`` asks for it (:func:`record_args`, :func:`force_args`):

* ``record`` (the full-cache engine): the log-softmax of the logits that produce output token ``t`` is written to
  row ``t`` of ``<directory>/<request>.npy`` (float32, ``[max_tokens, vocab]``); the logits are left as they are, so
  the request generates its own greedy answer, unless ``tokens`` are given, which are then forced as below;
* ``force`` (a compressed engine): at output token ``t`` the KL ``sum_v p_full(v) (log p_full(v) - log q(v))`` against
  row ``t`` of the recorded reference and the compressed model's own top token are written to row ``t`` of
  ``<results>/<request>.kl.npy`` and ``.top1.npy``; then every logit but that of ``tokens[t]`` (the full cache's
  answer) is set to ``-inf``, so greedy sampling emits the full cache's token and the next step is conditioned on the
  full cache's prefix.

Up to the first token where the compressed model's top token differs from the full cache's, a forced request computes
exactly what the free-running compressed request computes, so ``top1`` also gives the free-running answer's agreement
with the full cache's (the tokens before the first difference). Rows are written as they are produced, through
memory-mapped files, so the results do not depend on the process the worker runs in. A request preempted and
resumed goes on at the row of its next output token (its output token list, which vLLM hands the processor by
reference, holds every token generated so far).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

__all__ = ["KEY", "TeacherForcing", "force_args", "read_forced", "read_reference", "record_args"]

KEY = "ripplekv_fidelity"
"""The ``SamplingParams.extra_args`` key of a measured request."""


def record_args(request: str, directory: str | Path, tokens: list[int] | None = None) -> dict[str, Any]:
    """``extra_args`` of a request whose per-token log-probabilities are recorded (the full-cache reference).

    Args:
        request: the request's name (the file name of its reference).
        directory: where ``<request>.npy`` is written.
        tokens: an answer to force while recording (e.g. the library's full-cache answer, so that the engine's
            reference and the library's follow the same tokens); None: the request's own greedy answer.
    """
    spec: dict[str, Any] = {"mode": "record", "request": request, "directory": str(directory)}
    if tokens is not None:
        spec["tokens"] = [int(t) for t in tokens]
    return {KEY: spec}


def force_args(request: str, reference: str | Path, results: str | Path, tokens: list[int]) -> dict[str, Any]:
    """``extra_args`` of a request teacher-forced along ``tokens`` and compared with a recorded reference.

    Args:
        request: the request's name (as recorded under the full cache).
        reference: the directory of the recorded ``<request>.npy``.
        results: where ``<request>.kl.npy`` and ``<request>.top1.npy`` are written.
        tokens: the full cache's answer, forced token by token.
    """
    spec = {"mode": "force", "request": request, "directory": str(reference), "results": str(results)}
    return {KEY: {**spec, "tokens": [int(t) for t in tokens]}}


def read_reference(directory: str | Path, request: str) -> np.ndarray:
    """The recorded log-probabilities of ``request``, ``[max_tokens, vocab]`` (memory-mapped, read-only)."""
    return np.load(Path(directory) / f"{request}.npy", mmap_mode="r")


def read_forced(results: str | Path, request: str) -> tuple[np.ndarray, np.ndarray]:
    """``(kl, top1)`` of a forced request, one entry per output token (NaN / -1 where none was produced)."""
    base = Path(results) / request
    return np.array(np.load(f"{base}.kl.npy")), np.array(np.load(f"{base}.top1.npy"))


@dataclass
class _Measured:
    """One measured request in the batch: its spec, its live output token list, and its open files."""

    mode: str
    output: list[int]
    rows: np.ndarray  # record: the reference being written; force: the reference being read
    tokens: list[int] | None = None
    kl: np.ndarray | None = None
    top1: np.ndarray | None = None


def _open(spec: dict[str, Any], max_tokens: int, vocab: int, output: list[int]) -> _Measured:
    name = spec["request"]
    if spec["mode"] == "record":
        path = Path(spec["directory"]) / f"{name}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a preempted request comes back: keep the rows it already wrote
            rows = np.load(path, mmap_mode="r+")
        else:
            rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(max_tokens, vocab))
        return _Measured("record", output, rows, spec.get("tokens"))
    if spec["mode"] != "force":
        raise ValueError(f"{KEY}: mode {spec['mode']!r} is neither 'record' nor 'force'")
    reference = read_reference(spec["directory"], name)
    tokens = list(spec["tokens"])
    if reference.shape[0] < len(tokens) or reference.shape[1] != vocab:
        raise ValueError(f"{KEY}: reference of {name} is {reference.shape}, need {len(tokens)} rows of {vocab}")
    base = Path(spec["results"]) / name
    base.parent.mkdir(parents=True, exist_ok=True)
    files = []
    for suffix, dtype, fill in ((".kl.npy", np.float64, np.nan), (".top1.npy", np.int64, -1)):
        path = Path(f"{base}{suffix}")
        if path.exists():
            files.append(np.load(path, mmap_mode="r+"))
        else:
            array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(len(tokens),))
            array[:] = fill
            files.append(array)
    return _Measured("force", output, reference, tokens, files[0], files[1])


class TeacherForcing(LogitsProcessor):
    """Records (full cache) or compares and forces (compressed cache) the measured requests' tokens (see the module)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        """vLLM's logits-processor constructor.

        Args:
            vllm_config: the engine's config (its vocabulary size sizes the files).
            device: the device of the logits.
            is_pin_memory: unused.
        """
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.rows: dict[int, _Measured] = {}

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse a measured request that is not greedy or whose forced answer is longer than ``max_tokens``.

        Args:
            sampling_params: the request's ``SamplingParams``.
        """
        spec = (sampling_params.extra_args or {}).get(KEY)
        if spec is None:
            return
        if sampling_params.temperature != 0.0:
            raise ValueError(f"{KEY}: measured requests are greedy (temperature 0)")
        if spec.get("mode") == "force" and len(spec["tokens"]) < (sampling_params.max_tokens or 0):
            raise ValueError(f"{KEY}: {len(spec['tokens'])} forced tokens for max_tokens {sampling_params.max_tokens}")

    def is_argmax_invariant(self) -> bool:
        """False: forcing changes the greedy token (and vLLM then applies the processor before sampling)."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch's added, removed and moved rows.

        Args:
            batch_update: the batch's changes since the last step (None: none).
        """
        process_dict_updates(self.rows, batch_update, self._new)

    def _new(self, params: Any, prompt: list[int] | None, output: list[int]) -> _Measured | None:
        spec = (params.extra_args or {}).get(KEY)
        if spec is None:
            return None
        return _open(spec, int(params.max_tokens), self.vocab, output)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Record or compare each measured row's log-softmax; force the forced rows' tokens.

        Args:
            logits: ``[rows, vocab]``, the step's logits (row ``i`` is batch index ``i``).
        """
        if not self.rows:
            return logits
        index = sorted(self.rows)
        logprobs = torch.log_softmax(logits[index].to(torch.float32), dim=-1)
        for row, lp in zip(index, logprobs):
            measured = self.rows[row]
            position = len(measured.output)  # the output token these logits produce
            if measured.mode == "record":
                if position < measured.rows.shape[0]:
                    measured.rows[position] = lp.numpy()
                if measured.tokens is not None and position < len(measured.tokens):
                    logits[row].fill_(float("-inf"))
                    logits[row, measured.tokens[position]] = 0.0
                continue
            assert measured.tokens is not None and measured.kl is not None and measured.top1 is not None
            if position >= len(measured.tokens):
                continue
            reference = torch.from_numpy(np.array(measured.rows[position], dtype=np.float64))
            measured.kl[position] = float((reference.exp() * (reference - lp.to(torch.float64))).sum())
            measured.top1[position] = int(lp.argmax())
            forced = measured.tokens[position]
            logits[row].fill_(float("-inf"))
            logits[row, forced] = 0.0
        return logits
