"""/v1/chat/completions and /v1/score over the fake worker of tests/helpers/openai_fakes.py: shapes, logprobs layout,
streaming, the requests sent to the worker, and every rule's 400 in OpenAI's shape.
The proof against the real model is test_openai_client_e2e.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ingress.openai.chat import echo_text
from ingress.openai.schemas.chat import ChatMessage
from protocol import FinishReason, ModelInfo, RequestOutput
from tests.helpers.openai_fakes import INFO, Backend, call, error, sse, text_of, value

MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
PROMPT = "system: S|user: Hi|assistant: "  # the fake template's rendering of MESSAGES
PROMPT_IDS = [ord(c) - 32 for c in PROMPT]


async def chat(body: dict, backend: Backend | None = None):
    return await call(backend or Backend(), "POST", "/v1/chat/completions", {"messages": MESSAGES, **body})


async def score(body: dict, backend: Backend | None = None):
    return await call(backend or Backend(), "POST", "/v1/score", body)


# --- chat ---------------------------------------------------------------------------------------------

async def test_chat_answer_shape_with_logprobs():
    backend = Backend()
    resp = await chat({"model": "tiny", "max_completion_tokens": 2, "logprobs": True, "top_logprobs": 2,
                       "temperature": 0, "seed": 7}, backend)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny"
    (choice,) = body["choices"]
    first, second = PROMPT_IDS[-1] + 1, PROMPT_IDS[-1] + 2
    assert choice["message"] == {"role": "assistant", "content": text_of(first) + text_of(second)}
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    n = len(PROMPT_IDS)
    tops = [{"token": text_of(j), "logprob": -0.001 * j, "bytes": list(text_of(j).encode())} for j in range(2)]
    assert choice["logprobs"] == {"content": [
        {"token": text_of(t), "logprob": value(n + i, t), "bytes": list(text_of(t).encode()), "top_logprobs": tops}
        for i, t in enumerate((first, second))]}
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2}
    assert backend.chat_messages == [[{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]]
    (req,) = backend.requests
    p = req.params
    assert (req.input_ids, p.max_tokens, p.return_logprob, p.top_logprobs_num, p.temperature, p.seed,
            p.logprob_start_len) == (PROMPT_IDS, 2, True, 2, 0, 7, -1)


async def test_chat_without_logprobs_and_default_length():
    backend = Backend()
    choice = (await chat({"max_tokens": None}, backend)).json()["choices"][0]
    assert choice["logprobs"] is None
    # No limit: what the context (64) leaves after the prompt.
    assert backend.requests[0].params.max_tokens == INFO.max_model_len - len(PROMPT_IDS)
    assert backend.requests[0].params.return_logprob is False


async def test_chat_default_length_fits_the_workers_kv_cache():
    """A worker whose KV cache holds fewer tokens than the context: the default is what the cache leaves, so a
    client that omits max_tokens is served instead of refused."""
    backend = Backend()
    backend.info = dataclasses.replace(INFO, kv_capacity_tokens=40)
    assert (await chat({"max_tokens": None}, backend)).status_code == 200
    assert backend.requests[0].params.max_tokens == 40 - len(PROMPT_IDS)


async def test_max_completion_tokens_wins_over_max_tokens():
    backend = Backend()
    await chat({"max_tokens": 5, "max_completion_tokens": 3}, backend)
    assert backend.requests[0].params.max_tokens == 3


async def test_chat_stream_concatenates_to_the_answer():
    body = {"max_completion_tokens": 3, "logprobs": True, "top_logprobs": 1}
    whole = (await chat(body)).json()["choices"][0]
    chunks = sse(await chat({**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0] for c in chunks[:-1]]
    assert deltas[0]["delta"]["role"] == "assistant" and all("role" not in d["delta"] for d in deltas[1:])
    assert "".join(d["delta"]["content"] for d in deltas) == whole["message"]["content"]
    assert sum((d["logprobs"]["content"] for d in deltas), []) == whole["logprobs"]["content"]
    assert [d["finish_reason"] for d in deltas] == [None, None, "length"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def test_chat_echo_starts_the_content_with_the_last_assistant_message():
    """vLLM's chat echo: the last message's text when it is the assistant's (text parts joined by newlines), in the
    message or the first delta; logprobs stay the generated tokens'; a last user message echoes nothing."""
    turn = {"role": "assistant", "content": "It is a"}
    body = {"messages": [*MESSAGES, turn], "echo": True, "max_completion_tokens": 2, "logprobs": True}
    whole = (await chat(body)).json()["choices"][0]
    plain = (await chat({**body, "echo": False})).json()["choices"][0]
    assert whole["message"]["content"] == "It is a" + plain["message"]["content"]
    assert whole["logprobs"] == plain["logprobs"] and len(whole["logprobs"]["content"]) == 2
    deltas = [c["choices"][0] for c in sse(await chat({**body, "stream": True}))]
    assert deltas[0]["delta"]["content"].startswith("It is a")
    assert "".join(d["delta"]["content"] for d in deltas) == whole["message"]["content"]
    user_last = (await chat({"echo": True, "max_completion_tokens": 2})).json()["choices"][0]
    assert user_last["message"]["content"] == (await chat({"max_completion_tokens": 2})).json()[
        "choices"][0]["message"]["content"]
    parts = ChatMessage(role="assistant", content=[{"type": "text", "text": "It is"}, {"type": "text", "text": "a"}])
    assert echo_text([parts]) == "It is\na"


async def test_chat_stream_failure_is_an_error_event():
    def dies(req):
        yield RequestOutput(request_id=req.rid, text="A", new_token_ids=[33], completion_tokens=1)
        yield RequestOutput(request_id=req.rid, finished=True,
                            finish_reason=FinishReason("error", message="engine died"))

    chunks = sse(await chat({"stream": True}, Backend(dies)))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "A"}
    assert chunks[-1] == {"error": {"message": "engine died", "type": "server_error", "param": None, "code": 500}}


@pytest.mark.parametrize("body, param, words", [
    ({"messages": []}, "messages", "must not be empty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "`image_url` part"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "template rejected"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "positive"),
    ({"max_tokens": -2}, "max_tokens", "positive"),
    ({"max_tokens": 60}, "messages", "context length 64"),
    ({"top_logprobs": 2}, "top_logprobs", "requires logprobs=true"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "non-negative"),
    ({"n": 2}, "n", "one choice per prompt"),
    ({"temperature": -1}, "temperature", "non-negative"),
    ({"stop": [""]}, "stop", "must not be empty"),
    ({"tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "requires stream"),
])
async def test_chat_rules_are_400_with_openai_shape(body, param, words):
    backend = Backend()
    assert words in error(await chat(body, backend), 400, param)
    assert backend.requests == []


async def test_chat_model_and_shape_errors():
    assert "`tiny`" in error(await chat({"model": "gpt-4o"}), 404, "model")
    error(await chat({"messages": [{"role": "robot", "content": "x"}]}), 422, "messages")
    error(await chat({"logprobs": 1}), 422, "logprobs")


async def test_message_fields_reach_the_template_or_are_refused():
    """name, tool_calls and tool_call_id go to the chat template as given (as vLLM gives them); a field a message,
    a content part or stream_options does not declare is a 422 naming it, never dropped."""
    backend = Backend()
    call_ = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "Hi", "name": "ann"},
                {"role": "assistant", "content": None, "tool_calls": [call_]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    await chat({"messages": messages}, backend)  # the fake's template takes no tool turn (a 400): what it was given
    assert backend.chat_messages == [[{"role": "user", "content": "Hi", "name": "ann"},
                                      {"role": "assistant", "content": "", "tool_calls": [call_]},
                                      {"role": "tool", "content": "42", "tool_call_id": "c1"}]]
    for body, name in [({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}]},
                        "reasoning_content"),
                       ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}]}]},
                        "cache"),
                       ({"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                        "continuous_usage_stats")]:
        r = await chat(body, backend)
        assert r.status_code == 422 and name in r.text
    assert len(backend.chat_messages) == 1 and backend.requests == []


async def test_chat_logprobs_need_raw_logprobs_mode():
    backend = Backend()
    backend.info = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=64, logprobs_mode="raw_logits")
    assert "raw_logprobs" in error(await chat({"logprobs": True}, backend), 400, "logprobs")


# --- score --------------------------------------------------------------------------------------------

def expected(prompt_len: int, labels: list[int], apply_softmax: bool) -> list[float]:
    values = [value(prompt_len, t) for t in labels]
    if not apply_softmax:
        return [math.exp(v) for v in values]
    return [math.exp(v) / sum(math.exp(u) for u in values) for v in values]


@pytest.mark.parametrize("apply_softmax", [False, True])
async def test_score_ids(apply_softmax):
    backend = Backend()
    body = {"query": [1, 2], "items": [[3], [4, 5, 6]], "label_token_ids": [7, 9], "apply_softmax": apply_softmax}
    resp = await score(body, backend)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["object"] == "scoring" and answer["model"] == "tiny"
    want = [expected(3, [7, 9], apply_softmax), expected(5, [7, 9], apply_softmax)]
    assert answer["scores"] == [pytest.approx(row, abs=1e-12) for row in want]
    assert answer["usage"] == {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8}
    # One scoring-only request per item, as SGLang: query+item+[first label], its one row after query+item reporting
    # every label (token_ids_logprob).
    sent = [(r.input_ids, r.params.logprob_start_len, r.params.max_tokens, r.params.token_ids_logprob)
            for r in backend.requests]
    assert sent == [([1, 2, 3, 7], 2, 0, [7, 9]), ([1, 2, 4, 5, 6, 7], 4, 0, [7, 9])]


async def test_score_labels_are_bounded_by_one_rows_ids_not_by_the_fan_out():
    """40 labels (above max_batch_items, 32) are one request per item; repeats keep their place; more labels than
    max_token_ids_logprob is a 400 naming it and the body's field, before any worker call."""
    backend = Backend()
    labels = [*range(1, 41), 7]  # ids below the fake's vocabulary (100)
    resp = await score({"query": [1, 2], "items": [[3]], "label_token_ids": labels}, backend)
    assert resp.status_code == 200, resp.text
    assert resp.json()["scores"] == [pytest.approx(expected(3, labels, False), abs=1e-12)]
    assert len(backend.requests) == 1
    backend = Backend()
    resp = await score({"query": [1, 2], "items": [[3]], "label_token_ids": [1] * 257}, backend)
    assert "max_token_ids_logprob" in error(resp, 400, "label_token_ids") and backend.requests == []


async def test_score_text_and_item_first():
    backend = Backend()
    body = {"query": "AB", "items": ["C", "DE"], "label_token_ids": [5], "item_first": True}
    answer = (await score(body, backend)).json()
    assert answer["scores"] == [expected(3, [5], False), expected(4, [5], False)]
    # Texts are joined, then tokenized: item first.
    assert [r.input_ids for r in backend.requests] == [[35, 33, 34, 5], [36, 37, 33, 34, 5]]


async def test_score_single_text_item_and_no_items():
    assert len((await score({"query": "A", "items": "B", "label_token_ids": [1, 2]})).json()["scores"]) == 1
    backend = Backend()
    assert (await score({"query": "A", "items": [], "label_token_ids": [1]}, backend)).json()["scores"] == []
    assert backend.requests == []


async def test_score_apply_softmax_works_on_raw_logits():
    backend = Backend()
    backend.info = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=64, logprobs_mode="raw_logits")
    body = {"query": [1], "items": [[2]], "label_token_ids": [3, 4]}
    assert (await score({**body, "apply_softmax": True}, backend)).status_code == 200
    assert "raw_logprobs" in error(await score(body, backend), 400, "apply_softmax")


@pytest.mark.parametrize("body, status, param, words", [
    ({"query": "A", "items": ["B"]}, 400, "label_token_ids", "non-empty"),
    ({"query": "A", "items": ["B"], "label_token_ids": []}, 400, "label_token_ids", "non-empty"),
    ({"query": "A", "items": ["B"], "label_token_ids": [100]}, 400, "label_token_ids", "Token id 100"),
    ({"items": ["B"], "label_token_ids": [1]}, 400, "query", "must be provided"),
    ({"query": "A", "label_token_ids": [1]}, 400, "items", "must be provided"),
    ({"query": "A", "items": [[1]], "label_token_ids": [1]}, 400, "items", "both be text or both"),
    ({"query": [1], "items": ["B"], "label_token_ids": [1]}, 400, "items", "both be text or both"),
    ({"query": [1, -1], "items": [[1]], "label_token_ids": [1]}, 400, "query", "Token id -1"),
    ({"query": [1], "items": [[1], [200]], "label_token_ids": [1]}, 400, "items", "Token id 200"),
    ({"query": "", "items": ["B", ""], "label_token_ids": [1]}, 400, "items", "Item 1: query and item have no"),
    ({"query": [1] * 60, "items": [[1] * 4], "label_token_ids": [1]}, 400, "items", "context length 64"),
    ({"model": "other", "query": "A", "items": ["B"], "label_token_ids": [1]}, 404, "model", "`other`"),
    ({"query": "A", "items": ["B"], "label_token_ids": ["x"]}, 422, "label_token_ids", ""),
    ({"query": "A", "items": [["B"]], "label_token_ids": [1]}, 422, "items", ""),
])
async def test_score_errors(body, status, param, words):
    backend = Backend()
    assert words in error(await score(body, backend), status, param)
    assert backend.requests == []


async def test_openapi_documents_the_new_routes():
    paths = (await call(Backend(), "GET", "/openapi.json")).json()["paths"]
    for path in ("/v1/chat/completions", "/v1/score"):
        assert set(paths[path]["post"]["responses"]) == {"200", "400", "401", "404", "413", "422", "500", "503", "504"}
