"""benchmarks/gpu/check.sh, the prepared GPU check: its CPU dry run end to end, its JSON schema and its planning."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu.efficiency_gpu import (
    METHODS,
    RESULT_NAME,
    ROW_KEYS,
    SCHEMA,
    main,
    plan_length,
    predicted_seconds,
    pytest_summary,
)

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "benchmarks" / "gpu" / "check.sh"
BUDGETS = (0.1, 0.2, 0.3)
DRY_LENGTHS = (256, 512)


def validate(result: dict, lengths: tuple[int, ...]) -> None:
    """The schema of gpu-check.json: every method x budget x length, finite ratios, consistent fractions."""
    assert result["schema"] == SCHEMA
    for key in ("torch", "transformers", "kvpress", "python", "device", "gpu_name", "gpu_memory_bytes"):
        assert key in result["environment"], key
    assert result["environment"]["kvpress"] and result["environment"]["transformers"]
    assert result["settings"]["lengths"] == list(lengths) and result["settings"]["budgets"] == list(BUDGETS)
    assert result["settings"]["methods"] == list(METHODS)
    assert result["profile"]["synthetic"] is True and "NOT measured" in result["profile"]["note"]
    assert "RANDOM" in result["model"]["weights"]
    rows = {(r["tokens"], r["budget"], r["method"]): r for r in result["rows"]}
    assert len(rows) == len(result["rows"]) == len(lengths) * len(BUDGETS) * len(METHODS)
    for tokens in lengths:
        for budget in BUDGETS:
            for method in METHODS:
                row = rows[tokens, budget, method]
                assert set(row) == set(ROW_KEYS), set(row) ^ set(ROW_KEYS)
                for key in ("prefill_s", "time_ratio_to_snapkv", "decode_ms_per_step"):
                    assert math.isfinite(row[key]) and row[key] > 0, (key, row)
                assert row["full_bytes"] > 0 and len(row["kept_tokens"]) == len(result["profile"]["scores"])
                if method == "full":
                    assert row["kept_fraction"] == row["held_fraction"] == 1.0
                else:
                    assert abs(row["kept_fraction"] - budget) < 0.02, row
                assert (row["mask_index_bytes"] > 0) == (method == "adakv")
                assert row["held_fraction"] == (1.0 if method in ("full", "adakv") else row["kept_fraction"])
            assert rows[tokens, budget, "snapkv"]["time_ratio_to_snapkv"] == 1.0
    assert math.isfinite(result["worst_ripplekv_time_ratio"]) and result["goal_ripplekv_time_ratio"] == 1.02
    assert set(result["by_length"]) == {str(n) for n in lengths}


def test_dry_run_of_check_sh_writes_the_whole_schema(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)  # the device tool's results folder: never this test's
    done = subprocess.run(
        ["bash", str(CHECK), "--dry-run", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / RESULT_NAME).read_text())
    validate(result, DRY_LENGTHS)
    assert result["dry_run"] is True and result["complete"] is True
    assert result["skipped"] == [] and result["skipped_reason"] is None
    assert result["environment"]["device"] == "cpu"
    assert result["pytest"] == {"ran": False, "reason": "not run: dry run"}
    assert all(r["gpu_peak_mib"] is None for r in result["rows"])  # no CUDA allocator on the CPU
    assert "DRY RUN" in (tmp_path / "check.log").read_text()
    assert "RippleKV / SnapKV prefill-and-compress time" in done.stdout


def test_help_documents_the_device_tool_and_the_status() -> None:
    done = subprocess.run(["bash", str(CHECK), "--help"], capture_output=True, text=True, timeout=30, check=True)
    assert "NOT run on a GPU yet" in done.stdout and "carry=" in done.stdout and "--dry-run" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would measure the 8B model")
def test_without_a_gpu_it_says_so_and_writes_a_skipped_result(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / RESULT_NAME).read_text())
    assert result["schema"] == SCHEMA and result["dry_run"] is False
    assert "no CUDA GPU" in result["skipped_reason"]
    assert result["environment"]["torch"] == torch.__version__


def test_planning_cuts_repeats_then_budgets_then_skips() -> None:
    # a 4K prefill of 0.2 s and a 32K one of 2 s: a*n + b*n^2 through both
    history = [{"tokens": 4096, "prefill": 0.2, "decode": 0.1}, {"tokens": 32768, "prefill": 2.0, "decode": 0.2}]
    one = predicted_seconds(history, 131072, 13, 1)
    assert 13 * 2.0 * 4 < one < 13 * 2.0 * 16 * 1.1  # between linear and quadratic scaling from 32K
    assert predicted_seconds(history, 131072, 13, 2) == pytest.approx(2 * one)
    assert plan_length(history, 131072, BUDGETS, 2, 10 * one)[:2] == (2, BUDGETS)
    assert plan_length(history, 131072, BUDGETS, 2, 1.5 * one)[:2] == (1, BUDGETS)
    assert plan_length(history, 131072, BUDGETS, 2, 0.8 * one)[:2] == (1, (0.1, 0.2))  # 9 of 13 configurations
    assert plan_length(history, 131072, BUDGETS, 2, 0.5 * one)[:2] == (1, (0.1,))  # 5 of 13
    assert plan_length(history, 131072, BUDGETS, 2, 0.1 * one) is None


def test_pytest_summary_reads_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_gpu" name="test_a" time="0.5"/>'
        '<testcase classname="tests.test_gpu" name="test_b" time="0.1"><failure message="boom">trace</failure>'
        '</testcase><testcase classname="tests.test_gpu" name="test_c" time="0"><skipped message="no flash"/>'
        "</testcase></testsuite></testsuites>"
    )
    summary = pytest_summary(report, returncode=1)
    assert (summary["tests"], summary["passed"], summary["failures"], summary["skipped"]) == (3, 1, 1, 1)
    outcomes = {c["test"]: (c["outcome"], c.get("message")) for c in summary["cases"]}
    assert outcomes["tests.test_gpu::test_b"] == ("failure", "boom")
    assert outcomes["tests.test_gpu::test_c"] == ("skipped", "no flash")
    assert pytest_summary(tmp_path / "missing.xml", 2)["error"].startswith("no junit report")
