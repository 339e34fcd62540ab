"""/generate batches (SGLang's list of prompts) over the fake backend: order, shapes, per-item validation,
streaming tagged with `index`, and failures. The proof against the real model is test_openai_client_e2e.py."""

from __future__ import annotations

import json

import pytest

from protocol import FinishReason, GenerateRequest, RequestOutput
from tests.helpers.fakes import SCORE, FakeBackend, fake_model, post


def events(resp) -> list:
    assert resp.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in resp.text.split("\n\n") if b]
    out = [b[6:] if b == "data: [DONE]" else json.loads(b[6:]) for b in blocks]
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out[:-1]


def without_id(answer: dict) -> dict:
    return {**answer, "meta_info": {k: v for k, v in answer["meta_info"].items() if k != "id"}}


async def test_batch_of_ids_equals_the_single_answers_in_order():
    ids = [[3, 4, 5], [10], [7, 8]]
    body = {"max_tokens": 3, "return_logprob": True, "top_logprobs_num": 2}
    backend = FakeBackend()
    resp = await post(backend, {**body, "input_ids": ids})
    assert resp.status_code == 200, resp.text
    answers = resp.json()
    assert isinstance(answers, list) and len(answers) == 3
    singles = [(await post(FakeBackend(), {**body, "input_ids": one})).json() for one in ids]
    assert [without_id(a) for a in answers] == [without_id(s) for s in singles]
    # One worker request per item, each with its own id.
    assert [r.input_ids for r in backend.requests] == ids
    assert len({a["meta_info"]["id"] for a in answers}) == 3


async def test_batch_of_scoring_requests():
    resp = await post(FakeBackend(), {**SCORE, "input_ids": [[3, 4, 5, 6], [1, 2, 9]]})
    rows = [a["meta_info"]["input_token_logprobs"] for a in resp.json()]
    assert rows == [[[-2.5, 5], [-3.0, 6]], [[-4.5, 9]]]


async def test_batch_of_text_prompts_and_rids():
    backend = FakeBackend()
    resp = await post(backend, {"prompt": ["a", "b"], "max_tokens": 1, "rid": ["x", "y"]})
    assert [a["meta_info"]["id"] for a in resp.json()] == ["x", "y"]
    assert [(r.input_ids, r.rid) for r in backend.requests] == [([ord("a") - 32], "x"), ([ord("b") - 32], "y")]


async def test_batch_items_take_the_request_id_with_their_position():
    resp = await post(FakeBackend(), {"input_ids": [[1], [2]], "max_tokens": 1}, headers={"X-Request-ID": "abc"})
    assert [a["meta_info"]["id"] for a in resp.json()] == ["abc-0", "abc-1"]


async def test_batch_of_one_is_a_list():
    resp = await post(FakeBackend(), {"input_ids": [[5]], "max_tokens": 1})
    assert isinstance(resp.json(), list) and len(resp.json()) == 1


@pytest.mark.parametrize("body, message", [
    ({"input_ids": [[1, 2], []]}, "Item 1: The input_ids must not be an empty list"),
    ({"input_ids": [[1], [2, 100]]}, "Item 1: Token id 100 is out of range for the vocabulary size 100."),
    ({"prompt": ["a", ""]}, "Item 1: The prompt must not be an empty string"),
    ({"prompt": []}, "The prompt must not be an empty list"),
    ({"prompt": ["a"], "input_ids": [[1]]}, "You must specify exactly one of prompt or input_ids"),
    ({"input_ids": [[1], [1] * 600]},
     "Item 1: The prompt length 600 plus max_tokens 128 exceeds the model's context length 512."),
    ({"input_ids": [[1], [2]], "max_tokens": -1}, "Item 0: The max_tokens -1 must be non-negative."),
    ({**SCORE, "input_ids": [[1, 2, 3], [4, 5]]},
     "Item 1: logprob_start_len(1) exceeds the last scorable source position for input_ids length(2)."),
    ({"input_ids": [[1], [2]], "rid": "one"}, "The rid of a batch must be a list of 2 strings, one per item."),
    ({"input_ids": [[1], [2]], "rid": ["one"]}, "The rid of a batch must be a list of 2 strings, one per item."),
    ({"input_ids": [1], "rid": ["one"]}, "The rid must be a string for a single prompt."),
])
async def test_batch_validation_names_the_item(body, message):
    backend = FakeBackend()
    for stream in (False, True):
        resp = await post(backend, {**body, "stream": stream})
        assert resp.status_code == 400, resp.text
        assert resp.json() == {"object": "error", "message": message, "type": "invalid_request_error",
                               "code": 400, "param": None}
    assert backend.requests == []  # no item of a rejected batch reaches a worker


@pytest.mark.parametrize("body", [{"input_ids": [[1], 2]}, {"input_ids": [[1], ["a"]]}, {"prompt": ["a", 1]},
                                  {"prompt": [["a"]]}, {"input_ids": [[[1]]]}])
async def test_batch_shape_errors_are_422(body):
    resp = await post(FakeBackend(), body)
    assert resp.status_code == 422 and isinstance(resp.json()["detail"], list)


async def test_streamed_batch_tags_events_with_index_and_ends_once():
    body = {"input_ids": [[3], [20, 21], [50]], "max_tokens": 3, "return_logprob": True}
    whole = (await post(FakeBackend(), body)).json()
    streamed = events(await post(FakeBackend(), {**body, "stream": True}))
    assert len(streamed) == 9 and sorted({e["index"] for e in streamed}) == [0, 1, 2]
    for i, answer in enumerate(whole):
        mine = [e for e in streamed if e["index"] == i]
        assert "".join(e["text"] for e in mine) == answer["text"]
        assert sum((e["output_ids"] for e in mine), []) == answer["output_ids"]
        assert sum((e["meta_info"]["output_token_logprobs"] for e in mine), []) == (
            answer["meta_info"]["output_token_logprobs"])
        assert mine[-1]["meta_info"]["finish_reason"] == {"type": "length"}


async def test_single_stream_events_have_no_index():
    streamed = events(await post(FakeBackend(), {"input_ids": [3], "max_tokens": 2, "stream": True}))
    assert all("index" not in e for e in streamed)


def fails_on_item(bad: int, code: int | None):
    def script(req: GenerateRequest):
        if req.input_ids == [bad]:
            yield RequestOutput(request_id=req.rid, finished=True,
                                finish_reason=FinishReason("error", message="nope", code=code))
            return
        yield from fake_model(req)
    return script


@pytest.mark.parametrize("code, status", [(400, 400), (500, 500)])
async def test_an_item_that_fails_first_decides_the_status(code, status):
    backend = FakeBackend(fails_on_item(9, code))
    for stream in (False, True):
        resp = await post(backend, {"input_ids": [[1], [9]], "max_tokens": 2, "stream": stream})
        assert resp.status_code == status and resp.json()["message"] == "nope"


async def test_an_item_failing_mid_stream_ends_the_stream_with_its_error_event():
    def script(req: GenerateRequest):
        chunks = list(fake_model(req))
        if req.input_ids == [9]:
            yield chunks[0]
            yield RequestOutput(request_id=req.rid, finished=True, finish_reason=FinishReason("error", message="died"))
            return
        yield from chunks

    streamed = events(await post(FakeBackend(script), {"input_ids": [[1], [9]], "max_tokens": 5, "stream": True}))
    last = streamed[-1]
    assert last["index"] == 1 and last["meta_info"]["finish_reason"] == {"type": "error", "message": "died"}
