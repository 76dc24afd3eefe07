"""benchmarks/whole_layers.py: the whole layers of a per-prompt schedule and the paired split, on synthetic rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.whole_layers import main, whole_layers


def row(sample: str, method: str, kept: list[int], kl: float, task: str = "vt") -> dict[str, object]:
    return {
        "sample_id": f"{task}/{sample}",
        "task": task,
        "method": method,
        "scorer": "snapkv",
        "budget": 0.2,
        "kept_tokens": kept,
        "compressed_tokens": 10,
        "fidelity_kl": kl,
    }


def test_whole_layers_are_those_that_kept_the_compressed_prefix() -> None:
    assert whole_layers(row("a", "squeezeattention", [10, 3, 10, 9], 0.1)) == (0, 2)
    assert whole_layers(row("a", "squeezeattention", [3, 3, 3, 3], 0.1)) == ()


def test_split_by_the_chosen_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        row("a", "squeezeattention", [10, 2, 10], 0.1),
        row("a", "ripplekv", [5, 6, 3], 0.4),
        row("b", "squeezeattention", [10, 2, 2], 0.5, task="cwe"),
        row("b", "ripplekv", [5, 6, 3], 0.2, task="cwe"),
        row("c", "squeezeattention", [10, 2, 2], 0.3, task="cwe"),  # no ripplekv row: left out
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(sys, "argv", ["whole_layers.py", str(tmp_path), "--layer", "2"])
    main()
    out = capsys.readouterr().out
    assert "snapkv 20%: whole layers of squeezeattention (prompts): [0, 2] 1; [0] 1" in out
    assert "layer 2 whole: 1 prompts, mean ripplekv - squeezeattention +0.300" in out
    assert "layer 2 not whole: 1 prompts, mean ripplekv - squeezeattention -0.300" in out
    assert "tasks where it was whole: vt 1" in out
