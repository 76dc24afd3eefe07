"""Tests of ripplekv_eval: the LongBench v1 / LongBench-E protocol and official metrics (no model needed)."""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from pathlib import Path

import pytest
from tokenizers import processors
from transformers import PreTrainedTokenizerFast

from ripplekv_eval.tasks import longbench as lb
from ripplekv_eval.tasks import metrics as m
from tests._tokenizers import train_byte_level_bpe

DATA_DIR = Path("/work/shared/data/longbench")
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"LongBench-mini data not found at {DATA_DIR}")

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    corpus = list(lb.PROMPTS.values()) + [" ".join(WORDS * 3)] * 5 + ["Question: What is a city ?\nType: Location\n"]
    return train_byte_level_bpe(corpus, vocab_size=400)


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The same tokenizer, adding a BOS to every plain encoding, with a chat template that writes the BOS itself."""
    chat = copy.deepcopy(tokenizer)
    bos = "<|endoftext|>"
    chat.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, chat.convert_tokens_to_ids(bos))]
    )
    chat.bos_token = bos
    chat.chat_template = CHAT_TEMPLATE
    return chat


def record(task: str, context: str, question: str, answers: tuple[str, ...] = ("x",)) -> lb.LongBenchRecord:
    return lb.LongBenchRecord(
        task=task, input=question, context=context, answers=answers, all_classes=None, length=100, id="r0"
    )


def ids_of(tokenizer: PreTrainedTokenizerFast, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


# ---------------------------------------------------------------- configuration


def test_task_tables_cover_the_16_english_tasks() -> None:
    assert len(lb.ENGLISH_TASKS) == 16
    for table in (lb.PROMPTS, lb.MAX_NEW_TOKENS, lb.TASK_METRIC):
        assert set(table) == set(lb.ENGLISH_TASKS)
    assert set(lb.TASK_METRIC.values()) <= set(m.METRICS)
    for task, template in lb.PROMPTS.items():
        assert template.count("{context}") == 1, task
        has_input = task not in {"gov_report", "multi_news", "passage_count", "lcc"}
        assert ("{input}" in template) == has_input, task
    assert lb.MAX_NEW_TOKENS["gov_report"] == 512 and lb.MAX_NEW_TOKENS["samsum"] == 128
    assert lb.MAX_NEW_TOKENS["hotpotqa"] == 32 and lb.MAX_NEW_TOKENS["lcc"] == 64
    assert lb.FIRST_LINE_TASKS <= lb.NO_CHAT_TEMPLATE


def test_official_templates_spot_checks() -> None:
    assert lb.PROMPTS["trec"].format(context="C", input="Q") == (
        "Please determine the type of the question below. Here are some examples of questions.\n\nC\nQ"
    )
    assert (
        lb.PROMPTS["lcc"].format(context="def f():\n")
        == "Please complete the code given below. \ndef f():\nNext line of code:\n"
    )
    assert lb.PROMPTS["hotpotqa"] is lb.PROMPTS["2wikimqa"] is lb.PROMPTS["musique"]
    assert "\n\n Answer the question based on the above article" in lb.PROMPTS["qasper"]  # official stray space
    assert lb.PROMPTS["passage_count"].endswith("The final answer is: ")


# SHA-256 of json.dumps({task: template for the 16 English tasks}, sort_keys=True) of THUDM/LongBench's
# LongBench/config/dataset2prompt.json (the official file, commit 2e00731 of the main branch).
OFFICIAL_PROMPTS_SHA256 = "75e339f4f58566663b9e2916d85ca7258191b614158272128161675baece6c42"


def test_templates_are_the_official_text_character_for_character() -> None:
    # the official narrativeqa template reads "asconcisely", twice; it is kept verbatim
    assert lb.PROMPTS["narrativeqa"] == (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: "
        "{context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if "
        "possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    )
    english = {task: lb.PROMPTS[task] for task in lb.ENGLISH_TASKS}
    digest = hashlib.sha256(json.dumps(english, sort_keys=True).encode()).hexdigest()
    assert digest == OFFICIAL_PROMPTS_SHA256


def test_base_task() -> None:
    assert lb.base_task("hotpotqa_e") == "hotpotqa"
    assert lb.base_task("passage_retrieval_en_e") == "passage_retrieval_en"
    assert lb.base_task("multifieldqa_en") == "multifieldqa_en"
    assert lb.base_task("repobench-p_e") == "repobench-p"
    for bad in ("lsht", "hotpotqa_x", "dureader_e", ""):
        with pytest.raises(ValueError, match="unknown LongBench task"):
            lb.base_task(bad)


# ---------------------------------------------------------------- metrics


def test_normalize_answer() -> None:
    assert m.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert m.normalize_answer("An apple a day") == "apple day"
    assert m.normalize_answer("theatre (A)") == "theatre"  # "the" inside a word stays; "(A)" -> "a" -> removed
    assert m.normalize_answer("") == ""


def test_qa_f1_score() -> None:
    # "cat sat" vs "cat sat down": P = 2/2, R = 2/3, F1 = 0.8
    assert m.qa_f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert m.qa_f1_score("Yanzhou.", "yanzhou") == 1.0
    # multiplicity counts: {x:2, y:1} & {x:1, y:2} = 2 common tokens of 3 -> F1 = 2/3
    assert m.qa_f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert m.qa_f1_score("", "Yanzhou") == 0.0
    assert m.qa_f1_score("The", "a") == 0.0  # both normalize to nothing


def test_rouge_score() -> None:
    # rouge 1.0.1 counts unique words: LCS 3, |ref| = 3, |hyp| = {the, cat, sat, on, mat} = 5 -> F = 2*0.6/1.6
    assert m.rouge_score("the cat sat on the mat", "the cat sat") == pytest.approx(0.75, abs=1e-6)
    assert m.rouge_score("a b. c d", "a b c d") == pytest.approx(1.0, abs=1e-6)  # union LCS over "." sentences
    assert m.rouge_score("The Cat", "the cat") == 0.0  # case-sensitive
    assert m.rouge_score("foo bar", "baz qux") == 0.0
    assert m.rouge_score("", "the cat") == 0.0  # ValueError inside rouge -> 0.0
    assert m.rouge_score("   ", "the cat") == 0.0  # ZeroDivisionError inside rouge -> 0.0
    assert m.rouge_score("...", "the cat") == 0.0


def test_classification_score() -> None:
    classes = ["Location", "City", "Description", "Description of something"]
    assert m.classification_score("Location", "Location", all_classes=classes) == 1.0
    # "Description" is a strict sub-string of the ground truth: dropped
    assert m.classification_score("Description of something", "Description of something", all_classes=classes) == 1.0
    # ground truth "Description": the longer class name found in the prediction is not its sub-string: kept -> 1/2
    assert m.classification_score("Description of something", "Description", all_classes=classes) == 0.5
    assert m.classification_score("City or Location", "City", all_classes=classes) == 0.5
    assert m.classification_score("no idea", "City", all_classes=classes) == 0.0  # official: no difflib fallback
    assert m.classification_score("", "City", all_classes=classes) == 0.0
    with pytest.raises(ValueError, match="all_classes"):
        m.classification_score("City", "City")


def test_classification_score_keeps_the_official_iteration_quirk() -> None:
    # matched = [abc, def, abc def]; removing "abc" while iterating skips "def", which stays: 1/2 instead of 1
    assert m.classification_score("abc def", "abc def", all_classes=["abc", "def", "abc def"]) == 0.5
    # without an element right after the removed one, the removal is complete
    assert m.classification_score("abc def", "abc def", all_classes=["abc", "abc def"]) == 1.0


def test_count_score() -> None:
    assert m.count_score("6", "6") == 1.0
    assert m.count_score("There are 6 unique paragraphs, not 7.", "6") == 0.5
    assert m.count_score("16", "6") == 0.0  # whole numbers only
    assert m.count_score("six", "6") == 0.0  # no number at all
    assert m.count_score("", "6") == 0.0


def test_retrieval_score() -> None:
    assert m.retrieval_score("Paragraph 6", "Paragraph 6") == 1.0
    assert m.retrieval_score("Paragraph 16 or Paragraph 6", "Paragraph 6") == 0.5
    assert m.retrieval_score("The answer is 6, 6 and 3", "Paragraph 6") == pytest.approx(2 / 3)
    assert m.retrieval_score("I do not know", "Paragraph 6") == 0.0
    assert m.retrieval_score("", "Paragraph 6") == 0.0
    with pytest.raises(ValueError, match="Paragraph"):
        m.retrieval_score("6", "6")


def test_fuzz_ratio() -> None:
    assert m.fuzz_ratio("abcd", "abce") == 75  # 2 * 3 / 8
    assert m.fuzz_ratio("ab", "abc") == 80
    assert m.fuzz_ratio("a", "a" + "b" * 15) == 12  # 2 * 1 / 16 = 12.5, rounded half to even
    assert m.fuzz_ratio("", "") == 100
    assert m.fuzz_ratio("", "x") == 0 and m.fuzz_ratio("x", "") == 0


def test_fuzz_ratio_matches_fuzzywuzzy_pure_python() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fuzz = pytest.importorskip("fuzzywuzzy.fuzz")
    if fuzz.SequenceMatcher.__module__ != "difflib":
        pytest.skip("fuzzywuzzy runs on python-Levenshtein here, not on difflib as in the official environment")
    pairs = [
        ("return x;", "        return x;"),
        ("\t\t\tString invKnj = invKnjPanel.getCode();", "String inv = panel.getCode()"),
        ("for (int i = 0; i < n; i++) {", "for i in range(n):"),
        ("self.assertEqual(a, b)", "self.assertEquals(b, a)"),
        ("", "x"),
        ("same", "same"),
    ]
    for first, second in pairs:
        assert m.fuzz_ratio(first, second) == fuzz.ratio(first, second), (first, second)


def test_code_sim_score() -> None:
    assert m.code_sim_score("```java\n# comment\nint x = 1;\n```", "int x = 1;") == 1.0
    # official rule: a line CONTAINING '#' or '//' anywhere is skipped too
    assert m.code_sim_score("x = 1  # set\ny = 2", "y = 2") == 1.0
    assert m.code_sim_score("\n\nabcd\nzzz", "abce") == 0.75  # leading newlines dropped, first line used
    assert m.code_sim_score("", "int x = 1;") == 0.0
    assert m.code_sim_score("// only a comment", "int x = 1;") == 0.0  # no code line: empty prediction


# ---------------------------------------------------------------- scoring


def test_postprocess_and_stop_on_newline() -> None:
    assert lb.postprocess("trec", "\n\nLocation\nQuestion: next") == "Location"
    assert lb.postprocess("triviaqa_e", "Paris\nParis again") == "Paris"
    assert lb.postprocess("samsum", "") == ""
    assert lb.postprocess("hotpotqa", "\nYanzhou\nmore") == "\nYanzhou\nmore"
    assert lb.stop_on_newline("samsum") and lb.stop_on_newline("samsum_e")
    assert not lb.stop_on_newline("trec")


def test_score_record() -> None:
    # first line only, max over answers
    assert lb.score_record("triviaqa", "the Paris\nLondon", ("London", "Paris")) == 1.0
    assert lb.score_record("hotpotqa_e", "Yanzhou District", ("Yanzhou",)) == pytest.approx(2 / 3)
    assert lb.score_record("passage_count", "6 or 7", ("6",)) == 0.5
    assert lb.score_record("trec", "City\nLocation", ("City",), ("City", "Location")) == 1.0
    assert lb.score_record("lcc", "int x = 1;", ()) == 0.0
    with pytest.raises(ValueError, match="sequence of strings"):
        lb.score_record("hotpotqa", "Yanzhou", "Yanzhou")


def test_length_buckets() -> None:
    assert [lb.length_bucket(n) for n in (0, 3999, 4000, 7999, 8000)] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+"]


# ---------------------------------------------------------------- prompts


def test_build_prompt_plain(tokenizer: PreTrainedTokenizerFast) -> None:
    context = "Question: What is alpha ?\nType: Location"
    rec = record("trec", context, "Question: What is beta ?\nType:")
    built = lb.build_prompt(rec, tokenizer, max_length=10_000)
    assert built.text == lb.PROMPTS["trec"].format(context=context, input=rec.input)
    assert built.input_ids == ids_of(tokenizer, built.text)
    assert not built.truncated
    # the byte-level pre-tokenizer keeps "\n" apart from the letters around it: the split is exact
    assert tokenizer.decode(built.input_ids[: built.question_start]).endswith("Type: Location")
    assert tokenizer.decode(built.input_ids[built.question_start :]) == "\n" + rec.input


def test_build_prompt_chat_template(chat_tokenizer: PreTrainedTokenizerFast) -> None:
    rec = record("hotpotqa_e", "Passage 1:\nalpha beta gamma", "Which one is beta?")
    built = lb.build_prompt(rec, chat_tokenizer, max_length=10_000)
    prompt = lb.PROMPTS["hotpotqa"].format(context=rec.context, input=rec.input)
    assert built.text == f"<|endoftext|><|user|>\n{prompt}\n<|assistant|>\n"
    bos = chat_tokenizer.bos_token_id
    assert built.input_ids == ids_of(chat_tokenizer, built.text, add_special_tokens=False)
    assert built.input_ids[0] == bos and built.input_ids.count(bos) == 1  # the template's BOS, not a second one
    tail = chat_tokenizer.decode(built.input_ids[built.question_start :])
    assert tail.startswith("\n\nAnswer the question") and tail.endswith(
        "Question: Which one is beta?\nAnswer:\n<|assistant|>\n"
    )


def test_build_prompt_no_chat_tasks_ignore_the_chat_template(chat_tokenizer: PreTrainedTokenizerFast) -> None:
    for task in ("trec", "triviaqa_e", "samsum", "lcc", "repobench-p"):
        rec = record(task, "alpha beta", "gamma")
        built = lb.build_prompt(rec, chat_tokenizer, max_length=10_000)
        assert built.text == lb.PROMPTS[lb.base_task(task)].format(context="alpha beta", input="gamma")
        assert built.input_ids[0] == chat_tokenizer.bos_token_id  # plain prompt: the tokenizer's own BOS


def test_chat_template_switch(tokenizer: PreTrainedTokenizerFast, chat_tokenizer: PreTrainedTokenizerFast) -> None:
    # auto: pred.py's rule, and only for a tokenizer that has a chat template
    assert lb.uses_chat_template("hotpotqa", chat_tokenizer) and not lb.uses_chat_template("samsum_e", chat_tokenizer)
    assert not lb.uses_chat_template("hotpotqa", tokenizer, "auto")
    assert lb.uses_chat_template("trec", chat_tokenizer, "on") and lb.uses_chat_template("lcc_e", chat_tokenizer, "on")
    assert not any(lb.uses_chat_template(task, chat_tokenizer, "off") for task in lb.ENGLISH_TASKS)
    with pytest.raises(ValueError, match="no chat template"):
        lb.uses_chat_template("hotpotqa", tokenizer, "on")
    with pytest.raises(ValueError, match="chat_template must be one of"):
        lb.uses_chat_template("hotpotqa", chat_tokenizer, "yes")

    trec = record("trec", "alpha beta", "gamma")
    prompt = lb.PROMPTS["trec"].format(context="alpha beta", input="gamma")
    assert (
        lb.build_prompt(trec, chat_tokenizer, 10_000, "on").text == f"<|endoftext|><|user|>\n{prompt}\n<|assistant|>\n"
    )
    hotpot = record("hotpotqa", "alpha beta", "gamma")
    plain = lb.build_prompt(hotpot, chat_tokenizer, 10_000, "off")
    assert plain.text == lb.PROMPTS["hotpotqa"].format(context="alpha beta", input="gamma")
    assert plain.input_ids == ids_of(chat_tokenizer, plain.text)  # a plain prompt keeps the tokenizer's BOS
    assert lb.build_prompt(hotpot, chat_tokenizer, 10_000) == lb.build_prompt(hotpot, chat_tokenizer, 10_000, "auto")


def test_build_prompt_middle_truncation(tokenizer: PreTrainedTokenizerFast) -> None:
    context = " ".join(WORDS[i % len(WORDS)] + str(i) for i in range(400))
    rec = record("trec", context, "Question: What is omega ?\nType:")
    full = ids_of(tokenizer, lb.PROMPTS["trec"].format(context=context, input=rec.input))
    assert len(full) > 4 * 160
    built = lb.build_prompt(rec, tokenizer, max_length=160)
    assert built.truncated
    expected = tokenizer.decode(full[:80], skip_special_tokens=True) + tokenizer.decode(
        full[-80:], skip_special_tokens=True
    )
    assert built.text == expected
    assert built.text.startswith("Please determine the type of the question below.")
    assert built.text.endswith("\nQuestion: What is omega ?\nType:")
    assert "alpha0 beta1" in built.text and "kappa393 lambda394" in built.text and "eta198" not in built.text
    assert abs(len(built.input_ids) - 160) <= 2  # re-tokenizing the joined text may merge at the seam
    assert tokenizer.decode(built.input_ids[built.question_start :]).endswith(rec.input)
    assert 0 < built.question_start < len(built.input_ids)


def test_build_prompt_truncation_into_the_question(tokenizer: PreTrainedTokenizerFast) -> None:
    question = " ".join(WORDS * 4)
    rec = record("passage_retrieval_en", " ".join(WORDS * 20), question)
    built = lb.build_prompt(rec, tokenizer, max_length=16)  # the tail half keeps only the end of the template
    assert built.truncated
    assert built.text.endswith("The answer is: ")
    assert 0 <= built.question_start < len(built.input_ids)


def test_build_prompt_rejects_bad_max_length(tokenizer: PreTrainedTokenizerFast) -> None:
    rec = record("trec", "alpha", "beta")
    for bad in (0, 1, -5):
        with pytest.raises(ValueError, match="max_length"):
            lb.build_prompt(rec, tokenizer, max_length=bad)


def test_newline_token_id(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokenizer.decode([lb.newline_token_id(tokenizer)]) == "\n"


# ---------------------------------------------------------------- loading


def write_jsonl(path: Path, rows: list[object]) -> None:
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8"
    )


GOOD = {
    "input": "Q?",
    "context": "C",
    "answers": ["A"],
    "length": 3,
    "dataset": "hotpotqa",
    "language": "en",
    "all_classes": None,
    "_id": "id1",
}


def test_load_task_tmp_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "hotpotqa_e.jsonl", [GOOD, "", {**GOOD, "_id": "id2", "all_classes": ["a", "b"]}])
    records = lb.load_task(tmp_path, "hotpotqa_e")
    assert [r.id for r in records] == ["id1", "id2"]
    assert records[0] == lb.LongBenchRecord("hotpotqa_e", "Q?", "C", ("A",), None, 3, "id1")
    assert records[1].all_classes == ("a", "b") and records[1].base_task == "hotpotqa"


def test_load_task_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="hotpotqa.jsonl"):
        lb.load_task(tmp_path, "hotpotqa")
    with pytest.raises(ValueError, match="unknown LongBench task"):
        lb.load_task(tmp_path, "nonexistent")
    write_jsonl(tmp_path / "trec.jsonl", [GOOD, '{"input": "broken"'])
    with pytest.raises(ValueError, match=r"trec\.jsonl:2: invalid JSON"):
        lb.load_task(tmp_path, "trec")
    write_jsonl(tmp_path / "qasper.jsonl", [GOOD, GOOD, {k: v for k, v in GOOD.items() if k != "answers"}])
    with pytest.raises(ValueError, match=r"qasper\.jsonl:3: missing field\(s\) answers"):
        lb.load_task(tmp_path, "qasper")
    write_jsonl(tmp_path / "lcc.jsonl", [{**GOOD, "answers": "A"}])
    with pytest.raises(ValueError, match=r"lcc\.jsonl:1: field 'answers' must be a list of strings"):
        lb.load_task(tmp_path, "lcc")
    write_jsonl(tmp_path / "samsum.jsonl", [{**GOOD, "length": "3"}])
    with pytest.raises(ValueError, match=r"samsum\.jsonl:1: field 'length' must be an integer"):
        lb.load_task(tmp_path, "samsum")
    write_jsonl(tmp_path / "musique.jsonl", [[1, 2]])
    with pytest.raises(ValueError, match=r"musique\.jsonl:1: expected a JSON object"):
        lb.load_task(tmp_path, "musique")


@needs_data
def test_load_task_real_records(tokenizer: PreTrainedTokenizerFast) -> None:
    hotpot = lb.load_task(DATA_DIR, "hotpotqa_e")[:2]
    assert hotpot[0].input == "Which city is under Jining, Kaiyuan, Liaoning or Yanzhou District?"
    assert hotpot[0].answers == ("Yanzhou",) and hotpot[0].all_classes is None
    assert hotpot[0].length == 3745 and hotpot[0].id == "1dae9ec530a93f43f85bd215a5c0e6737dbcf226cd3541d8"
    assert hotpot[0].context.startswith("Passage 1:\nKaiyuan, Liaoning")
    assert all(r.task == "hotpotqa_e" and r.base_task == "hotpotqa" and r.answers for r in hotpot)

    trec = lb.load_task(DATA_DIR, "trec_e")[:2]
    assert trec[0].input == "Question: What is nanotechnology ?\nType:"
    assert trec[0].answers == ("Definition of something",) and trec[0].length == 1093
    assert trec[0].all_classes is not None and "Definition of something" in trec[0].all_classes
    assert lb.score_record("trec_e", "Definition of something\nQuestion:", trec[0].answers, trec[0].all_classes) == 1.0

    built = lb.build_prompt(trec[1], tokenizer, max_length=256)
    assert built.truncated and built.text.endswith("\n" + trec[1].input)
    assert tokenizer.decode(built.input_ids[built.question_start :]).endswith(trec[1].input)
