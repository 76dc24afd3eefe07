"""Promises of the core that surviving mutants showed untested (``benchmarks/mutation.py``, ``docs/mutation.md``).

Each test names, in its docstring, the mutants it kills.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from ripplekv.allocation.budgets import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    AllocationConfig,
    BudgetSpec,
    allocate,
    kept_ratio,
)
from ripplekv.profiling.checkpoint import Checkpoint, SampleScores

# ------------------------------------------------------------------------------------------------ checkpoint

ONE = SampleScores(kl=(0.1, 0.2), local=(0.3, 0.4), context_tokens=5, continuation_tokens=2)


def test_sample_scores_are_frozen_and_hashable() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`SampleScores`."""
    assert hash(ONE) == hash(dataclasses.replace(ONE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ONE.kl = ()  # type: ignore[misc]


def test_a_checkpoint_in_a_new_folder_is_created(tmp_path: Path) -> None:
    """Kills ``mkdir(parents=False)``."""
    path = tmp_path / "a" / "b" / "run.partial.jsonl"
    Checkpoint(path, {"k": 1}).add(0, ONE)
    assert Checkpoint(path, {"k": 1}).done == {0: ONE}


def test_nothing_after_an_unreadable_line_is_trusted(tmp_path: Path) -> None:
    """A resumed run appends after a cut line, so that line and every later one are redone, not read. Kills
    ``break -> continue`` at the unreadable line."""
    path = tmp_path / "run.jsonl"
    first = Checkpoint(path, {"k": 1})
    first.add(0, ONE)
    with path.open("a") as f:
        f.write('{"sample": 1, "kl": [0.1\n')
    first.add(2, ONE)
    assert Checkpoint(path, {"k": 1}).done.keys() == {0}


def test_the_warning_names_a_setting_only_one_run_has(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A key that gained a field (``precision``) is named among the differences. Kills ``set(header) & set(key)``
    for ``|``."""
    path = tmp_path / "run.jsonl"
    Checkpoint(path, {"seed": 0}).add(0, ONE)
    with caplog.at_level(logging.WARNING, logger="ripplekv.profiling.checkpoint"):
        assert Checkpoint(path, {"seed": 0, "precision": "model"}).done == {}
    assert "(precision differ)" in caplog.text


# ------------------------------------------------------------------------------------------------ allocation


def test_default_ratio_and_gamma_are_the_documented_ones() -> None:
    """``--ratio`` 4.0 and ``--gamma`` 3.0 (docs/cli.md). Kills ``DEFAULT_RATIO = 5.0``, ``DEFAULT_GAMMA = 4.0``."""
    assert (DEFAULT_RATIO, DEFAULT_GAMMA) == (4.0, 3.0)
    assert AllocationConfig() == AllocationConfig(ratio=4.0, gamma=3.0)


def test_allocate_keeps_one_token_per_layer_by_default() -> None:
    """Kills ``min_tokens: int = 2`` in :func:`allocate`."""
    scores, steep = [0.0, 1.0, 2.0, 3.0], AllocationConfig(ratio=1000.0, gamma=1000.0)
    default = allocate(scores, tokens=1, prompt_tokens=100, config=steep)
    assert default.budgets == allocate(scores, tokens=1, prompt_tokens=100, min_tokens=1, config=steep).budgets
    assert default.budgets == (1, 1, 1, 1)
    assert allocate(scores, tokens=1, prompt_tokens=100, min_tokens=0, config=steep).budgets == (0, 0, 0, 4)


def test_allocation_is_frozen() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`Allocation`."""
    result = allocate([0.0, 1.0], budget=0.5, prompt_tokens=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.total = 0  # type: ignore[misc]


def test_kept_ratio_names_a_bad_prompt_length() -> None:
    """Kills ``or -> and`` in the ``prompt_tokens`` check of :func:`kept_ratio`."""
    with pytest.raises(ValueError, match="prompt_tokens must be an integer >= 1, got 0"):
        kept_ratio(1, 0)


def test_rounding_ties_go_to_the_less_sensitive_layer_when_ratio_is_below_one() -> None:
    """Equal clipped weights, one leftover token short for three layers: with ``ratio < 1`` the lower scores win it
    (the mirror of ``ratio > 1``). Kills ``-array -> array`` in the tie-breaking preference."""
    scores = [0.0, 0.5, 0.9, 1.0]
    below = allocate(scores, tokens=2, prompt_tokens=100, config=AllocationConfig(ratio=0.01, gamma=2.0))
    above = allocate(scores, tokens=2, prompt_tokens=100, config=AllocationConfig(ratio=100.0, gamma=2.0))
    assert below.weights == (1.0, 0.5, 0.5, 0.5) and below.budgets == (3, 2, 2, 1)
    assert above.weights == (1.0, 2.0, 2.0, 2.0) and above.budgets == (1, 2, 2, 3)


def test_budget_spec_kind_and_immutability() -> None:
    """Kills ``tokens is None`` for ``is not None`` in ``is_tokens`` and ``@dataclass(frozen=False)``."""
    assert BudgetSpec(tokens=5).is_tokens and not BudgetSpec(budget=0.5).is_tokens
    assert hash(BudgetSpec(budget=0.5)) == hash(BudgetSpec(budget=0.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        BudgetSpec(budget=0.5).budget = 0.2  # type: ignore[misc]
