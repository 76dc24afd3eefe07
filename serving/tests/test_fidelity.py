"""The teacher-forcing logits processor on synthetic logits: rows, positions, KL and forcing, without an engine.

The engine-level test (a served request forced along its own answer has KL 0, along another answer emits that
answer) is ``test_engine_tiny.py::test_teacher_forcing_in_the_engine``.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from ripplekv_vllm.fidelity import TeacherForcing, force_args, read_forced, read_reference, record_args

VOCAB = 5


def processor() -> TeacherForcing:
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB))
    return TeacherForcing(config, torch.device("cpu"), False)


def params(extra: dict | None, max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)


def update(size: int, added=(), removed=(), moved=()) -> BatchUpdate:
    return BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))


def test_record_writes_each_output_tokens_log_softmax_at_its_position(tmp_path: Path) -> None:
    lp = processor()
    out_a: list[int] = []
    out_b: list[int] = []
    lp.update_state(update(3, added=[(0, params(record_args("a", tmp_path)), [1], out_a), (2, params(None), [1], [])]))
    lp.update_state(update(3, added=[(1, params(record_args("b", tmp_path)), [1], out_b)]))
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    assert torch.equal(lp.apply(logits), before)  # recording leaves the logits alone
    out_a.append(int(before[0].argmax()))
    out_b.append(int(before[1].argmax()))
    # a swaps rows with b; the untracked row 2 leaves
    lp.update_state(update(2, removed=[2], moved=[(0, 1, MoveDirectionality.SWAP)]))
    second = torch.randn(2, VOCAB)
    lp.apply(second.clone())
    ref_a, ref_b = read_reference(tmp_path, "a"), read_reference(tmp_path, "b")
    assert ref_a.shape == (3, VOCAB)
    assert np.allclose(ref_a[0], torch.log_softmax(before[0], -1).numpy())
    assert np.allclose(ref_b[0], torch.log_softmax(before[1], -1).numpy())
    assert np.allclose(ref_a[1], torch.log_softmax(second[1], -1).numpy())  # a is row 1 after the swap
    assert np.allclose(ref_b[1], torch.log_softmax(second[0], -1).numpy())


def test_force_measures_kl_and_top1_then_emits_the_forced_token(tmp_path: Path) -> None:
    reference = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0, 0.5, 0.0], [0.0, 3.0, 0.0, 0.0, -2.0]]), -1)
    np.save(tmp_path / "a.npy", reference.numpy().astype(np.float32))
    lp = processor()
    output: list[int] = []
    lp.update_state(update(1, added=[(0, params(force_args("a", tmp_path, tmp_path / "res", [3, 1]), 2), [1], output)]))
    served = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])
    forced = lp.apply(served.clone())
    assert int(forced[0].argmax()) == 3  # the full cache's token, not the served model's top token (1)
    assert torch.isinf(forced[0, [0, 1, 2, 4]]).all()
    output.append(3)
    lp.apply(torch.tensor([[0.0, 3.0, 0.0, 0.0, -2.0]]))  # the reference's own logits: KL 0
    kl, top1 = read_forced(tmp_path / "res", "a")
    p = reference[0].exp()
    q = torch.log_softmax(served[0], -1)
    expected = float((p * (reference[0] - q)).sum())
    assert kl[0] == pytest.approx(expected, rel=1e-6) and expected > 0.1
    assert kl[1] == pytest.approx(0.0, abs=1e-6)
    assert top1.tolist() == [1, 1]


def test_force_kl_of_two_point_distributions(tmp_path: Path) -> None:
    """KL(p || q) of p = (0.9, 0.1), q = (0.5, 0.5) over a vocabulary whose other tokens have probability ~0."""
    big = -1e4
    p = torch.tensor([math.log(0.9), math.log(0.1), big, big, big])
    np.save(tmp_path / "a.npy", p[None].numpy().astype(np.float32))
    lp = processor()
    lp.update_state(update(1, added=[(0, params(force_args("a", tmp_path, tmp_path, [0]), 1), [1], [])]))
    lp.apply(torch.tensor([[0.0, 0.0, big, big, big]]))
    kl, _ = read_forced(tmp_path, "a")
    assert kl[0] == pytest.approx(0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5), rel=1e-5)


def test_forced_answer_shorter_than_max_tokens_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="forced tokens"):
        TeacherForcing.validate_params(params(force_args("a", tmp_path, tmp_path, [1]), max_tokens=2))
    with pytest.raises(ValueError, match="greedy"):
        TeacherForcing.validate_params(SamplingParams(temperature=1.0, extra_args=record_args("a", tmp_path)))


def test_record_can_force_a_given_answer(tmp_path: Path) -> None:
    """The full-cache engine recording along the library's answer: each row is recorded as it comes, then the given
    token is emitted whatever the engine's own top token."""
    lp = processor()
    output: list[int] = []
    lp.update_state(update(1, added=[(0, params(record_args("a", tmp_path, [4, 2]), 2), [1], output)]))
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0, 0.0]])
    forced = lp.apply(logits.clone())
    assert int(forced[0].argmax()) == 4 and torch.isinf(forced[0, :4]).all()
    assert np.allclose(read_reference(tmp_path, "a")[0], torch.log_softmax(logits[0], -1).numpy())
    output.append(4)
    assert int(lp.apply(logits.clone())[0].argmax()) == 2
