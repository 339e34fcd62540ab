"""The embedded default model: GGUF -> safetensors conversion, caching, and the tokenizer fix.

Slow (~1-2 min on CPU): the GGUF is converted once per module (into $RAYSCORE_CACHE_DIR when set, so a
warm cache skips it) and loaded once more through transformers as the reference.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine.loading.default_model as dm
from engine.config import DEFAULT_MODEL
from engine.loading.default_model import (
    default_cache_dir,
    ensure_default_model,
    gguf_path,
    resolve_model_path,
)

# Ids of SmolLM2's own tokenizer (HF tokenizer.json / llama.cpp "smollm" pre-tokenizer): every digit is
# split off before the byte-level regex, so whitespace before a digit stays one token.
DIGIT_CASES = {
    "a  1": [81, 256, 33],
    "x 12 34": [104, 216, 33, 34, 216, 35, 36],
    "price:  2024\n 7": [17517, 42, 256, 34, 32, 34, 36, 3805, 39],
}
NO_DIGIT_TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "a  b   c\n\n  d\t e",
    "  leading and trailing spaces  ",
    "naïve café — “quotes” 😀 日本語",
    "def f(x):\n    return x ** two  # comment\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "",
]
ROUNDTRIP_TEXTS = list(DIGIT_CASES) + NO_DIGIT_TEXTS + ["3.14159 and  42, 1e-5 or 0x1F", " 9\n\n 10  "]


@pytest.fixture(scope="module")
def cache_dir(smollm2_path: Path) -> Path:
    """The session's cache: conftest's smollm2_path converted the GGUF there (on a clean machine, as CI's, that is
    the conversion these tests check; converting it a second time would add ~40 s and check nothing more)."""
    return smollm2_path.parent


@pytest.fixture(scope="module")
def folder(cache_dir: Path) -> Path:
    return ensure_default_model(cache_dir)


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def raw_tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def gguf_tokenizer() -> Any:
    src = gguf_path()
    return AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)


def test_default_name_matches_engine_config() -> None:
    assert DEFAULT_MODEL == "smollm2-135m-instruct"


def test_folder_has_the_checkpoint_files(folder: Path) -> None:
    assert folder.name == DEFAULT_MODEL
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (folder / name).is_file(), name
    # No temp or half folders left next to it.
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(dm._TMP_PREFIX)]

    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192

    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys
    assert "lm_head.weight" not in keys  # tied: stored once


def test_second_call_is_cached(folder: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def fail(*args: object) -> None:
        raise AssertionError("a complete folder must not be converted again")

    monkeypatch.setattr(dm, "_convert", fail)
    start = time.perf_counter()
    assert ensure_default_model(cache_dir) == folder
    assert time.perf_counter() - start < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes


@torch.inference_mode()
def test_logits_match_the_gguf_model(folder: Path, tokenizer: Any) -> None:
    src = gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    expected = reference(ids).logits
    actual = model(ids).logits
    assert actual.shape == (1, ids.shape[1], 49152)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("text", list(DIGIT_CASES))
def test_digits_are_split_like_smollm2(text: str, tokenizer: Any, raw_tokenizer: Tokenizer) -> None:
    assert tokenizer(text)["input_ids"] == DIGIT_CASES[text]
    assert raw_tokenizer.encode(text).ids == DIGIT_CASES[text]


def test_the_gguf_tokenizer_has_the_digit_bug(gguf_tokenizer: Any) -> None:
    # Documents why the fix exists; if transformers fixes it upstream this test tells us.
    assert gguf_tokenizer("a  1")["input_ids"] == [81, 216, 216, 33]


@pytest.mark.parametrize("text", NO_DIGIT_TEXTS)
def test_text_without_digits_is_unchanged(text: str, tokenizer: Any, gguf_tokenizer: Any) -> None:
    assert tokenizer(text)["input_ids"] == gguf_tokenizer(text)["input_ids"]


@pytest.mark.parametrize("text", ROUNDTRIP_TEXTS)
def test_decode_encode_roundtrip(text: str, tokenizer: Any, raw_tokenizer: Tokenizer) -> None:
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert raw_tokenizer.decode(raw_tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_no_bos_or_eos_is_added(folder: Path, tokenizer: Any, raw_tokenizer: Tokenizer) -> None:
    assert tokenizer("hello")["input_ids"] == [28120]
    assert tokenizer("hello", add_special_tokens=True)["input_ids"] == [28120]
    assert raw_tokenizer.encode("hello", add_special_tokens=True).ids == [28120]
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["add_bos_token"] is False
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer.eos_token_id == 2
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(tokenizer) == 49152


def test_resolve_model_path(folder: Path, cache_dir: Path, tmp_path: Path) -> None:
    assert resolve_model_path(DEFAULT_MODEL, cache_dir) == folder
    assert resolve_model_path(str(tmp_path)) == tmp_path
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="neither the embedded default model"):
        resolve_model_path(str(missing))
    with pytest.raises(FileNotFoundError, match="does not download"):
        resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct")


def test_default_cache_dir_honours_the_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAYSCORE_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("RAYSCORE_CACHE_DIR")
    assert default_cache_dir().parts[-2:] == ("rayscore", "models")


# The locking / atomic-install logic, with a fast fake converter.


def _fake_converter(calls: list[int], delay: float = 0.0) -> Any:
    def convert(source: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(delay)
        for name in dm._REQUIRED_FILES:
            (out / name).write_text("{}")
        (out / dm._MARKER).write_text(json.dumps({"format_version": dm._FORMAT_VERSION}))

    return convert


def test_concurrent_callers_convert_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(dm, "_convert", _fake_converter(calls, delay=0.3))
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_default_model(tmp_path))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [tmp_path / DEFAULT_MODEL] * 3
    assert len(calls) == 1
    assert dm._is_complete(tmp_path / DEFAULT_MODEL)


def test_incomplete_or_stale_state_is_rebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(dm, "_convert", _fake_converter(calls))
    target = tmp_path / DEFAULT_MODEL
    target.mkdir()
    (target / "config.json").write_text("{}")  # a half folder, e.g. copied by hand
    crashed = tmp_path / (dm._TMP_PREFIX + "crashed")
    crashed.mkdir()
    assert ensure_default_model(tmp_path) == target
    assert len(calls) == 1 and dm._is_complete(target) and not crashed.exists()

    # An older format version is rebuilt too.
    (target / dm._MARKER).write_text(json.dumps({"format_version": dm._FORMAT_VERSION - 1}))
    ensure_default_model(tmp_path)
    assert len(calls) == 2 and dm._is_complete(target)
