"""``ripplekv eval`` / ``ripplekv profile --workers N``: sharded over Ray actors on a local 2-CPU Ray cluster, with a
tiny random-weight model (offline, CPU). Ray's rows and profile must equal the single-process ones."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Hashable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ripplekv import distributed
from ripplekv.cli.main import main
from ripplekv.profiling import distributed as profile_distributed
from ripplekv.profiling.checkpoint import Checkpoint
from ripplekv_eval.running import distributed as eval_distributed
from ripplekv_eval.running.results import CONFIG_FILE, RESULTS_FILE, ResultsLog, row_key
from tests.conftest import save_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = (
    "The river town kept its records in a stone house by the bridge. Every spring the water rose and the clerks "
    "carried the ledgers upstairs, counting boxes as they went. "
) * 30
WINDOW = 8
TIMING = ("seconds", "prefill_seconds", "decode_rows")  # how a row was run (batch sizes), not what it holds
SAMPLES = 4
CONFIGURATIONS = 1 + 3 * 2  # full, then snapkv, pyramidkv, ripplekv at two budgets


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-ray-model"), [TEXT], vocab_size=300, layers=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ray-data")
    records = [
        {"context": TEXT[i * 150 : i * 150 + 700], "question": "Where were the records kept?", "answers": ["stone"]}
        for i in range(SAMPLES)
    ]
    calib = [{"context": TEXT[i * 200 : i * 200 + 500], "continuation": " the clerks counted"} for i in range(4)]
    (folder / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "calib.jsonl").write_text("".join(json.dumps(r) + "\n" for r in calib))
    return {"docs": folder / "docs.jsonl", "calib": folder / "calib.jsonl"}


def _profile_args(model_dir: Path, calib: Path, out: Path) -> list[str]:
    return ["profile", "--model", str(model_dir), "--device", "cpu", "--calib", str(calib), "--out", str(out)]


def _eval_args(model_dir: Path, docs: Path, profile: Path, out: Path) -> list[str]:
    return [
        "eval",
        "--suite",
        "jsonl",
        "--data",
        str(docs),
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--methods",
        "full,snapkv,pyramidkv,ripplekv",
        "--budgets",
        "0.3,0.5",
        "--profile",
        str(profile),
        "--window-size",
        str(WINDOW),
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def single(model_dir: Path, data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The single-process profile and evaluation (``--workers 1``, the default), run with Ray impossible to import."""
    folder = tmp_path_factory.mktemp("single")
    profile = folder / "p.json"
    out = folder / "eval"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "ray", None)  # type: ignore[arg-type]
        assert main([*_profile_args(model_dir, data["calib"], profile), "--workers", "1"]) == 0
        assert main(_eval_args(model_dir, data["docs"], profile, out)) == 0
    return SimpleNamespace(profile=profile, eval=out)


@pytest.fixture(scope="module")
def ray_cluster(single: Any) -> Iterator[ModuleType]:
    """A local Ray cluster of 2 CPUs for the module (the CLI joins this process's connection)."""
    ray = pytest.importorskip("ray")
    # the actors cannot import this test module: its hooks travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _rows(out: Path) -> list[dict[str, Any]]:
    return ResultsLog(out / RESULTS_FILE).read()


def _comparable(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    keyed = {row_key(r): {k: v for k, v in r.items() if k not in TIMING} for r in rows}
    assert len(keyed) == len(rows), "a row was written twice"
    return keyed


class CrashOnce:
    """A worker hook: the actor running ``key`` exits (as a killed process does) before handing over its item
    number ``after``, once in the whole cluster (a marker file remembers it)."""

    def __init__(self, marker: Path, key: Hashable, after: int) -> None:
        self.marker, self.key, self.after = marker, key, after

    def __call__(self, key: Hashable, count: int) -> None:
        if key == self.key and count == self.after and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os._exit(1)


class RecordUnits:
    """A worker hook: records every unit an actor starts (a file per unit) in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, key: Hashable, count: int) -> None:
        if count == 0:
            (self.folder / f"unit-{key}").touch()


def test_missing_ray_names_the_install_command(
    single: Any, model_dir: Path, data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "ray", None)  # type: ignore[arg-type]
        with pytest.raises(ImportError, match=r"pip install 'ripplekv\[ray\]'"):
            distributed.require_ray()
        code = main([*_eval_args(model_dir, data["docs"], single.profile, tmp_path / "out"), "--workers", "2"])
    assert code == 2 and "pip install 'ripplekv[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["eval", "profile"])
def test_a_lost_worker_is_an_error_line_not_a_traceback(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """WorkerLostError (a unit lost its Ray worker too often) ends the CLI with an ``error:`` line and status 2."""

    def lose(*args: Any, **kwargs: Any) -> Any:
        raise distributed.WorkerLostError("unit 's1' lost its Ray worker 3 times: killed")

    monkeypatch.setattr(eval_distributed, "run_eval_ray", lose)
    monkeypatch.setattr(profile_distributed, "profile_model_ray", lose)
    if command == "eval":
        args = ["eval", "--suite", "needle", "--methods", "full,snapkv", "--no-progress"]
    else:
        args = ["profile"]
    code = main([*args, "--out", str(tmp_path / "out"), "--workers", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: unit 's1' lost its Ray worker 3 times: killed" in err and "Traceback" not in err


def test_actor_resources_follow_the_cluster() -> None:
    def fake(resources: dict[str, float]) -> Any:
        return SimpleNamespace(cluster_resources=lambda: resources)

    assert distributed.actor_options(fake({"CPU": 16.0, "GPU": 4.0}), 2) == {"num_gpus": 1}
    assert distributed.actor_options(fake({"CPU": 16.0, "GPU": 4.0}), 2, "cpu") == {"num_cpus": 8}
    assert distributed.actor_options(fake({"CPU": 2.0}), 2) == {"num_cpus": 1}
    with pytest.raises(ValueError, match="3 workers need one GPU each, but the Ray cluster has 2"):
        distributed.actor_options(fake({"CPU": 16.0, "GPU": 2.0}), 3)
    with pytest.raises(ValueError, match="but the Ray cluster has 2 CPUs"):
        distributed.actor_options(fake({"CPU": 2.0}), 3)
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        distributed.check_workers(0)


def test_eval_on_two_workers_equals_one_process(
    single: Any, ray_cluster: ModuleType, model_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "ray"
    assert main([*_eval_args(model_dir, data["docs"], single.profile, out), "--workers", "2"]) == 0
    reference = _comparable(_rows(single.eval))
    assert len(reference) == SAMPLES * CONFIGURATIONS
    assert _comparable(_rows(out)) == reference
    saved = json.loads((out / CONFIG_FILE).read_text())
    assert saved["config"] == json.loads((single.eval / CONFIG_FILE).read_text())["config"]


def test_eval_survives_a_killed_worker_and_resumes(
    single: Any,
    ray_cluster: ModuleType,
    model_dir: Path,
    data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run resumed from another run's rows, one of whose workers dies in the middle of a sample."""
    reference = _rows(single.eval)
    ids = list(dict.fromkeys(row["sample_id"] for row in reference))
    first = [row for row in reference if row["sample_id"] == ids[0]][:2]  # its full row and one more
    assert first[0]["method"] == "full"
    first[0] = {**first[0], "answer_ids": [5, 6, 7]}  # a stored answer is reused, never decoded again
    out = tmp_path / "resumed"
    out.mkdir()
    (out / CONFIG_FILE).write_text((single.eval / CONFIG_FILE).read_text())
    log = ResultsLog(out / RESULTS_FILE)
    for row in first:
        log.append(row)
    marker = tmp_path / "crashed"
    hook = CrashOnce(marker, ids[-1], after=2)  # the last sample dies after handing over its full row and one more
    monkeypatch.setattr(
        eval_distributed, "run_eval_ray", functools.partial(eval_distributed.run_eval_ray, worker_hook=hook)
    )
    with caplog.at_level(logging.WARNING, logger=distributed.__name__):
        assert main([*_eval_args(model_dir, data["docs"], single.profile, out), "--workers", "2"]) == 0
    assert marker.exists(), "no worker was killed"
    assert any("died running" in record.getMessage() for record in caplog.records)
    rows = _rows(out)
    assert rows[:2] == first  # rows already written are kept, and not written again
    resumed, expected = _comparable(rows), _comparable(reference)
    assert resumed.keys() == expected.keys()  # every row exactly once
    seeded = {row_key(row) for row in first}
    for key, row in resumed.items():
        if key in seeded:
            continue
        if key[0] == ids[0]:
            assert row["answer_tokens"] == 3  # scored against the stored answer
        else:
            assert row == expected[key]


def test_profile_on_two_workers_resumes_and_equals_one_process(
    single: Any,
    ray_cluster: ModuleType,
    model_dir: Path,
    data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupted single-process profile finished on two workers: only the missing samples are scored there."""
    from ripplekv.models.loading import load_model
    from ripplekv.profiling.calibration import load_calibration
    from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model

    out = tmp_path / "p.json"
    checkpoint = out.with_name(out.name + ".partial.jsonl")
    model, tokenizer = load_model(str(model_dir), device="cpu")

    class Interrupted(Exception):
        pass

    def stop_at_two(done: int, total: int) -> None:
        if done == 2:
            raise Interrupted

    calibration = load_calibration(str(data["calib"]), tokenizer, 8)
    with pytest.raises(Interrupted):
        profile_model(model, tokenizer, calibration, ProfilingConfig(), checkpoint=checkpoint, progress=stop_at_two)
    assert len(Checkpoint(checkpoint, json.loads(checkpoint.read_text().splitlines()[0])).done) == 2
    units = tmp_path / "units"
    units.mkdir()
    real = profile_distributed.profile_model_ray
    monkeypatch.setattr(
        profile_distributed, "profile_model_ray", functools.partial(real, worker_hook=RecordUnits(units))
    )
    assert main([*_profile_args(model_dir, data["calib"], out), "--workers", "2"]) == 0
    assert sorted(p.name for p in units.iterdir()) == ["unit-2", "unit-3"]
    assert not checkpoint.exists()
    ours, theirs = json.loads(out.read_text()), json.loads(single.profile.read_text())
    ours.pop("created"), theirs.pop("created")
    assert ours == theirs  # the same floats: each sample scored with the same arithmetic, merged in sample order
