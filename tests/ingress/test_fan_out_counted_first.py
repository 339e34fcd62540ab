"""Every fan-out bound is counted from the request itself, before any worker call: /v1/score's items and
a completions batch's prompts are refused with 400 naming `max_batch_items` without a text tokenized, and a route
that tokenizes many texts does it in one call of the text side (ingress/text.py; the worker calls are counted in
test_one_worker_call.py)."""

from __future__ import annotations

import pytest

from protocol import GenerateRequest, RequestOutput
from tests.helpers.openai_fakes import Backend, call, error

LIMIT_NAME = "config field `max_batch_items`"


class CountingBackend(Backend):
    """The fake worker, with its answers and the text side's tokenizing counted."""

    def __init__(self) -> None:
        super().__init__()
        self.worker_calls: list[str] = []

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.worker_calls.append("tokenize")
        return await super().tokenize(text, add_special_tokens)

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        self.worker_calls.append("tokenize_many")
        return [[ord(c) - 32 for c in t] for t in texts]

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        self.worker_calls.append("answers")
        return await super().answers(reqs)


@pytest.mark.parametrize("items", [[f"item {i}" for i in range(300)], [[5, i % 90] for i in range(300)]])
async def test_score_300_items_is_a_400_before_any_worker_call(items: list) -> None:
    backend = CountingBackend()
    query = "Is this good?" if isinstance(items[0], str) else [3, 4]
    msg = error(await call(backend, "POST", "/v1/score", {"query": query, "items": items, "label_token_ids": [1, 2]}),
                400)
    assert "makes 300 worker requests" in msg and LIMIT_NAME in msg  # one per item, whatever the labels
    assert backend.worker_calls == [] and backend.requests == []


async def test_score_at_the_limit_tokenizes_once() -> None:
    backend = CountingBackend()
    body = {"query": "Q", "items": [f"i{i}" for i in range(32)], "label_token_ids": [1, 2]}  # 32 = max_batch_items
    resp = await call(backend, "POST", "/v1/score", body)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["scores"]) == 32
    assert backend.worker_calls == ["tokenize_many", "answers"] and len(backend.requests) == 32


async def test_completions_prompts_counted_before_tokenizing() -> None:
    backend = CountingBackend()
    msg = error(await call(backend, "POST", "/v1/completions", {"prompt": ["A"] * 33, "max_tokens": 1}), 400)
    assert "makes 33 worker requests" in msg and LIMIT_NAME in msg
    assert backend.worker_calls == [] and backend.requests == []


async def test_completions_text_batch_tokenized_in_one_call() -> None:
    backend = CountingBackend()
    resp = await call(backend, "POST", "/v1/completions", {"prompt": ["AB", "C", "D"], "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    assert backend.worker_calls.count("tokenize_many") == 1 and "tokenize" not in backend.worker_calls
    assert [r.input_ids for r in backend.requests] == [[33, 34], [35], [36]]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [1], "apply_sofmax": True}),
    ("/tokenize", {"prompt": "ab", "add_special_token": True}),
    ("/detokenize", {"tokens": [1], "skip_special_tokens": False}),
])
async def test_an_undeclared_field_is_a_422_naming_it_before_any_worker_call(path: str, body: dict) -> None:
    backend = CountingBackend()
    resp = await call(backend, "POST", path, body)
    assert resp.status_code == 422, resp.text
    (extra,) = [name for name in body if name not in ("query", "items", "label_token_ids", "prompt", "tokens")]
    assert extra in resp.text and backend.worker_calls == []
