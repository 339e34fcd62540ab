"""No 5xx for what a client sends: a lone surrogate (valid JSON, "\\ud800") anywhere a string
goes, and bytes that are not UTF-8, are answered 4xx or served, never 500/503, on the contract's and OpenAI's
routes; an echo of such a string is written with JSON escapes."""

from __future__ import annotations

import json

import pytest

from tests.helpers.openai_fakes import Backend, call

SURROGATE = "\\ud800"  # as it appears in the JSON text: a lone high surrogate


@pytest.mark.parametrize(("path", "raw"), [
    ("/generate", '{"input_ids": [1, 2], "max_tokens": 1, "rid": "a%sb"}'),
    ("/generate", '{"prompt": "a%sb", "max_tokens": 1}'),
    ("/generate", '{"input_ids": [1, 2], "max_tokens": 1, "stop": ["%s"]}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "a%sb", "max_tokens": 1}'),
    ("/v1/completions", '{"model": "%s", "prompt": "x", "max_tokens": 1}'),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "%s"}]}'),
    ("/tokenize", '{"prompt": "a%sb"}'),
    ("/v1/score", '{"model": "tiny", "query": "q%s", "items": ["a"], "label_token_ids": [1]}'),
])
async def test_lone_surrogates_are_never_a_server_error(path: str, raw: str) -> None:
    resp = await call(Backend(), "POST", path, (raw % SURROGATE).encode())
    assert resp.status_code < 500, resp.text
    json.loads(resp.content.decode("utf-8"))  # the answer is valid UTF-8 JSON


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/tokenize"])
@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
async def test_bytes_that_are_not_utf8_are_a_4xx(path: str, content_type: str) -> None:
    resp = await call(Backend(), "POST", path, content=b'{"prompt": "\xff\xfe"}',
                      headers={"content-type": content_type})
    assert 400 <= resp.status_code < 500, resp.text


async def test_a_surrogate_prompt_names_the_rule() -> None:
    body = '{"model": "tiny", "prompt": "a' + SURROGATE + 'b"}'
    resp = await call(Backend(), "POST", "/v1/completions", body.encode())
    assert resp.status_code == 400 and "lone UTF-16 surrogate" in resp.json()["error"]["message"]
