"""HandleBackend's text side (ingress/text.py) over a fake DeploymentHandle (no Ray): the tokenizer is loaded once
per replica from the folder the worker reports, answers exactly what the workers' tokenizer answers, and no
tokenizer call reaches a worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ingress.transport import HandleBackend
from tests.helpers.fakes import INFO, FakeHandle, FakeMethod

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, who are you?"}]


def _backend(folder: Path) -> tuple[HandleBackend, FakeHandle]:
    handle = FakeHandle()
    handle.model_info = FakeMethod([dataclasses.replace(INFO, model_path=str(folder), vocab_size=49152)])
    return HandleBackend(handle), handle  # type: ignore[arg-type]


async def test_the_text_side_answers_as_the_served_tokenizer(smollm2_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    backend, handle = _backend(smollm2_path)
    text = "Hello, wörld! <|im_end|>"
    assert await backend.tokenize(text) == tok.encode(text, add_special_tokens=False)
    assert await backend.tokenize_many([text, "b"]) == [tok.encode(t, add_special_tokens=False) for t in (text, "b")]
    ids = tok.encode(text, add_special_tokens=False)
    assert await backend.detokenize(ids) == tok.decode(ids, skip_special_tokens=False)
    assert await backend.detokenize_many([ids, ids[:2]]) == [tok.decode(i, skip_special_tokens=False)
                                                           for i in (ids, ids[:2])]
    assert await backend.token_texts(ids) == [tok.decode([i], skip_special_tokens=False) for i in ids]
    # Again, in another order with ids not seen before: the cached texts and the new ones are each id's own.
    mixed = [*ids[::-1], 1234, ids[0], 4321]
    assert await backend.token_texts(mixed) == [tok.decode([i], skip_special_tokens=False) for i in mixed]
    assert backend._text.value is not None and backend._text.value.cached_token_texts([1234, 4321]) is not None
    prompt = await backend.apply_chat_template(CHAT)
    want = tok.encode(tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)
    assert prompt.error is None and prompt.ids == want
    info = await backend.tokenizer_info()
    assert (info.eos_token, info.eos_token_id, info.chat_template) == (tok.eos_token, tok.eos_token_id,
                                                                      tok.chat_template)
    # Loaded once, from the first ModelInfo; the worker was asked nothing but that (and its periodic refresh).
    loaded = backend._text.value
    assert loaded is not None and await backend.tokenize("again") and backend._text.value is loaded
    assert handle.generate.responses == [] and handle.generate_whole.responses == []


async def test_the_template_s_refusals_are_the_clients(smollm2_path: Path, tiny_models: dict[str, Path]) -> None:
    backend, _ = _backend(tiny_models["llama"])  # a tokenizer without a chat template
    assert (await backend.apply_chat_template(CHAT)).error == "The served model's tokenizer has no chat template."
    backend, _ = _backend(smollm2_path)
    with pytest.raises(ValueError, match="max_prompt_chars_per_token"):
        await backend.tokenize("x" * 100_000)
