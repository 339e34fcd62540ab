"""HandleBackend's tokenizer methods over a fake DeploymentHandle (no Ray): pass-through and caching."""

from __future__ import annotations

import pytest

from ingress.backend import HandleBackend
from protocol import TokenizerInfo
from tests.helpers.fakes import FakeHandle, FakeMethod, FakeResponse

TOK_INFO = TokenizerInfo(model_name="tiny", tokenizer_class="Fake", vocab_size=100, max_model_len=64,
                         eos_token="</s>", eos_token_id=2, bos_token=None, bos_token_id=None, pad_token=None,
                         pad_token_id=None, chat_template=None)


class Recording(FakeMethod):
    """A worker method that answers `answer` and records the arguments of each call."""

    def __init__(self, answer: object) -> None:
        super().__init__([answer])
        self.calls: list[tuple] = []

    def remote(self, *args) -> FakeResponse:
        self.calls.append(args)
        return super().remote(*args)


async def test_tokenizer_calls_go_to_the_worker_with_their_arguments():
    handle = FakeHandle()
    handle.tokenize, handle.detokenize, handle.token_texts = Recording([5, 6]), Recording("ab"), Recording(["a"])
    backend = HandleBackend(handle)
    assert await backend.tokenize("ab") == [5, 6] and handle.tokenize.calls == [("ab", False)]
    assert await backend.tokenize("ab", True) == [5, 6] and handle.tokenize.calls[-1] == ("ab", True)
    assert await backend.detokenize([5, 6]) == "ab" and handle.detokenize.calls == [([5, 6],)]
    assert await backend.token_texts([5]) == ["a"] and handle.token_texts.calls == [([5],)]


async def test_tokenizer_info_is_cached_after_first_success():
    handle = FakeHandle()
    handle.tokenizer_info = FakeMethod([RuntimeError("no replica yet")], [TOK_INFO])
    backend = HandleBackend(handle)
    with pytest.raises(RuntimeError):
        await backend.tokenizer_info()
    assert await backend.tokenizer_info() == TOK_INFO
    assert await backend.tokenizer_info() == TOK_INFO
    assert len(handle.tokenizer_info.responses) == 2
