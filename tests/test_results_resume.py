"""The resume-and-run loop shared by ``eval``, ``analyze`` and ``tune`` (``evaluation/running/results.py``)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ripplekv.locking import WriterBusyError
from ripplekv_eval.running.results import (
    LOCK_FILE,
    ConfigMismatchError,
    open_results,
    resume_state,
    run_pending,
)


@dataclass(frozen=True)
class _Sample:
    id: str


CONFIGS = [("full", 1.0), ("snapkv", 0.1), ("snapkv", 0.2)]
RESOLVED = {"kind": "test", "x": 1}


class _Runner:
    """Yields one row per pending configuration; raises after ``fail_after`` rows in total when set."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[str, list[tuple[str, float]], list[int] | None]] = []
        self.fail_after = fail_after
        self.rows = 0

    def __call__(
        self, sample: _Sample, pending: list[tuple[str, float]], answer: list[int] | None
    ) -> Iterator[dict[str, Any]]:
        self.calls.append((sample.id, list(pending), answer))
        for method, budget in pending:
            if self.fail_after is not None and self.rows >= self.fail_after:
                raise KeyboardInterrupt
            self.rows += 1
            ids = answer if answer is not None else [len(sample.id), 7]
            yield {"sample_id": sample.id, "method": method, "budget": budget, "answer_ids": ids}


def test_interrupted_run_resumes_only_the_missing_rows(tmp_path: Path) -> None:
    samples = [_Sample("a"), _Sample("bb"), _Sample("ccc")]
    with pytest.raises(KeyboardInterrupt), open_results(tmp_path, RESOLVED, {}) as folder:
        run_pending(samples, CONFIGS, folder, _Runner(fail_after=4), desc="t", progress=False)
    assert len(folder.log.read()) == 4

    folder = open_results(tmp_path, RESOLVED, {})  # the interrupted run's lock was released on the way out
    runner = _Runner()
    written = run_pending(samples, CONFIGS, folder, runner, desc="t", progress=False)
    folder.close()
    assert written == 5
    # "a" is complete and skipped; "bb" gets its two missing configurations with the stored full-cache answer
    assert runner.calls == [("bb", [("snapkv", 0.1), ("snapkv", 0.2)], [2, 7]), ("ccc", CONFIGS, None)]
    keys = [(r["sample_id"], r["method"], r["budget"]) for r in folder.log.read()]
    assert len(keys) == len(set(keys)) == 9
    assert run_pending(samples, CONFIGS, open_results(tmp_path, RESOLVED, {}), _Runner(), "t", False) == 0


def test_on_row_sees_every_written_row(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    folder = open_results(tmp_path, RESOLVED, {})
    run_pending([_Sample("a")], CONFIGS, folder, _Runner(), desc="t", progress=False, on_row=seen.append)
    assert seen == folder.log.read()
    assert {(m, b) for _, m, b in folder.done} == set(CONFIGS)


def test_resume_state_answers_from() -> None:
    rows = [
        {"sample_id": "a", "method": "snapkv", "budget": 0.1, "answer_ids": [9]},
        {"sample_id": "a", "method": "full", "budget": 1.0, "answer_ids": [1, 2]},
        {"sample_id": "b", "method": "layer-damage", "budget": 0.1, "answer_ids": [3]},
        {"sample_id": "c", "method": "full", "budget": 1.0, "answer_ids": []},
    ]
    done, answers = resume_state(rows)
    assert answers == {"a": [1, 2]}
    assert ("b", "layer-damage", 0.1) in done and len(done) == 4
    assert resume_state(rows, answers_from=None)[1] == {"a": [1, 2], "b": [3]}


def test_rows_file_without_config_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "damage.jsonl").write_text("")
    with pytest.raises(ConfigMismatchError, match="damage.jsonl but no config.json"):
        open_results(tmp_path, RESOLVED, {}, rows_file="damage.jsonl")
    other = tmp_path / "other"
    open_results(other, RESOLVED, {})
    with pytest.raises(ConfigMismatchError, match="another configuration"):
        open_results(other, {"kind": "test", "x": 2}, {})


def test_one_writer_per_folder(tmp_path: Path) -> None:
    """A second run into a folder another holds stops before it checks, repairs or appends anything, with a clear
    error; closing the first (or leaving its ``with`` block, error or not) frees the folder. Seeded bug:
    without the lock the second open repairs the first's half-written last row away."""
    first = open_results(tmp_path, RESOLVED, {})
    first.log.path.write_text('{"sample_id": "a", "method": "full", "budget": 1.0}\n{"sample_id": "a", "met')
    with pytest.raises(WriterBusyError, match="is being written by another run: wait for it to finish"):
        open_results(tmp_path, RESOLVED, {})
    assert first.log.path.read_text().endswith('"met')  # the writer's partial row left alone
    first.close()
    first.close()  # twice: nothing
    with open_results(tmp_path, RESOLVED, {}) as second:
        assert len(second.done) == 1  # the interrupted last row repaired by the one writer
    with pytest.raises(ConfigMismatchError):
        open_results(tmp_path, {"kind": "test", "x": 2}, {})  # refused, and its lock released on the way out
    open_results(tmp_path, RESOLVED, {}).close()


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    """Another process holding the folder blocks this one; killed (no clean exit), it leaves the folder free."""
    code = (
        "import sys, time; from ripplekv_eval.running.results import open_results; "
        f"folder = open_results(sys.argv[1], {RESOLVED!r}, {{}}); print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(WriterBusyError, match="being written by another run"):
            open_results(tmp_path, RESOLVED, {})
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (tmp_path / LOCK_FILE).exists()
    open_results(tmp_path, RESOLVED, {}).close()
