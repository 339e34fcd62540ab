"""The ingress routes over a fake backend: statuses, JSON shapes, SSE framing, errors, abort on disconnect.

No Ray: the app is built with `build_fastapi_app(FakeBackend(...))` and driven through httpx's
ASGITransport, or through raw ASGI calls where a test needs to disconnect mid-answer.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from protocol import FinishReason, RequestOutput
from tests.helpers.fakes import HANG, SCORE, FakeBackend, client, fake_model, post


def events(resp: httpx.Response) -> list[dict | str]:
    """The SSE events of a buffered response: dicts, then the literal "[DONE]"."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text.endswith("\n\n")
    out: list[dict | str] = []
    for block in resp.text.split("\n\n")[:-1]:
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out


def error_body(message: str) -> dict:
    return {
        "object": "error",
        "message": message,
        "type": "invalid_request_error",
        "code": 400,
        "param": None,
    }


META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "input_token_logprobs",
    "input_top_logprobs",
    "output_token_logprobs",
    "output_top_logprobs",
    "weight_version",
}


# --- answers ----------------------------------------------------------------------------------------


async def test_generation_json_shape_without_logprobs():
    resp = await post(FakeBackend(), {"input_ids": [7], "max_tokens": 3, "rid": "r1"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"text", "output_ids", "meta_info"} and set(body["meta_info"]) == META_KEYS
    assert body["text"] == "<8><9><10>" and body["output_ids"] == [8, 9, 10]
    meta = body["meta_info"]
    assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length"}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (1, 3, 0)
    for key in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs"):
        assert meta[key] is None


async def test_generation_logprobs_empty_list_stays_empty():
    resp = await post(FakeBackend(), {"input_ids": [7], "max_tokens": 2, "return_logprob": True})
    meta = resp.json()["meta_info"]
    assert meta["output_token_logprobs"] == [[-1.0, 8], [-1.0, 9]]
    assert meta["output_top_logprobs"] == []  # requested and empty: [] not null
    assert meta["input_token_logprobs"] is None  # not requested: null


async def test_rid_made_when_absent_and_sent_to_worker():
    backend = FakeBackend()
    resp = await post(backend, {"prompt": "hi", "max_tokens": 1, "stop": "x", "top_logprobs_num": None})
    rid = resp.json()["meta_info"]["id"]
    assert len(rid) == 32 and backend.requests[0].rid == rid
    req = backend.requests[0]
    p = req.params
    assert req.input_ids == [ord("h") - 32, ord("i") - 32]  # the text, tokenized by the route
    assert p.stop == ["x"] and p.return_logprob is False and p.top_logprobs_num == 0


async def test_scoring_json():
    resp = await post(FakeBackend(), {**SCORE, "top_logprobs_num": 2})
    assert resp.status_code == 200
    body = resp.json()
    assert body["text"] == "" and body["output_ids"] == []
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length"} and meta["completion_tokens"] == 0
    assert meta["prompt_tokens"] == 4
    assert meta["input_token_logprobs"] == [[-2.5, 5], [-3.0, 6]]
    assert meta["input_top_logprobs"] == [[[-0.1, 0], [-0.1, 1]]] * 2
    assert meta["output_token_logprobs"] is None and meta["output_top_logprobs"] is None


async def test_scoring_stream_is_one_event_then_done():
    plain = (await post(FakeBackend(), {**SCORE, "rid": "s"})).json()
    resp = await post(FakeBackend(), {**SCORE, "rid": "s", "stream": True})
    assert resp.status_code == 200
    evs = events(resp)
    assert len(evs) == 2 and evs[0] == plain
    assert resp.text.startswith("data: {") and resp.text.endswith("data: [DONE]\n\n")


async def test_stream_deltas_concatenate_to_the_json_answer():
    req = {"input_ids": [7], "max_tokens": 4, "return_logprob": True, "top_logprobs_num": 1, "rid": "g"}
    plain = (await post(FakeBackend(), req)).json()
    evs = events(await post(FakeBackend(), {**req, "stream": True}))[:-1]
    assert len(evs) == 4
    assert all(e["meta_info"]["finish_reason"] is None for e in evs[:-1])
    assert evs[-1]["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert "".join(e["text"] for e in evs) == plain["text"]
    assert sum((e["output_ids"] for e in evs), []) == plain["output_ids"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert sum((e["meta_info"][key] for e in evs), []) == plain["meta_info"][key]
    assert evs[-1]["meta_info"]["completion_tokens"] == plain["meta_info"]["completion_tokens"]


async def test_non_finite_logprobs_do_not_break_the_answer():
    def script(req):
        yield RequestOutput(
            request_id=req.rid,
            finished=True,
            finish_reason=FinishReason(type="length"),
            input_token_logprobs=[[float("-inf"), 3]],
        )

    for stream in (False, True):
        resp = await post(FakeBackend(script), {**SCORE, "stream": stream})
        assert resp.status_code == 200 and "-Infinity" in resp.text


# --- 400 / 422 through HTTP -------------------------------------------------------------------------


async def test_validation_error_body_is_exact():
    resp = await post(FakeBackend(), {"top_logprobs_num": 1})  # fails rules 2 and 4: rule 2 wins
    assert resp.status_code == 400
    assert resp.json() == error_body("top_logprobs_num requires return_logprob=True.")


async def test_rejected_request_never_reaches_the_worker():
    backend = FakeBackend()
    for stream in (False, True):
        resp = await post(backend, {"input_ids": [7], "max_tokens": -1, "stream": stream})
        assert resp.status_code == 400 and resp.json()["message"] == "The max_tokens -1 must be non-negative."
    assert backend.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [1], "max_tokens": "5"},
        {"input_ids": [True]},
        {"input_ids": [1.5]},
        {"input_ids": "1 2 3"},
        {"input_ids": [1], "logprob_start_len": -2},
        {"input_ids": [1], "stream": "yes"},
        {"input_ids": [1], "stop": 5},
        [1, 2, 3],
        "just a string",
        None,
    ],
)
async def test_type_errors_are_422_with_detail(body):
    resp = await post(FakeBackend(), body)
    assert resp.status_code == 422
    assert isinstance(resp.json()["detail"], list) and resp.json()["detail"]


@pytest.mark.parametrize(
    ("raw", "headers"),
    [
        (b"{not json", {"content-type": "application/json"}),
        (b'{"input_ids": [1,', {"content-type": "application/json"}),
        (b"", {"content-type": "application/json"}),
        (b'{"temperature": NaN, "input_ids": [1]}', {"content-type": "application/json"}),
        (b'{"temperature": -Infinity, "input_ids": [1]}', {"content-type": "application/json"}),
        (b"\xff\xfe\x00garbage", {"content-type": "application/json"}),
        (b'{"input_ids": [1]}', {"content-type": "text/plain"}),
        (b'{"input_ids": [' + b"9" * 5000 + b"]}", {"content-type": "application/json"}),
        (b'{"image_data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {"content-type": "application/json"}),
    ],
)
async def test_malformed_bodies_are_4xx(raw, headers):
    resp = await post(FakeBackend(), raw, headers=headers)
    assert 400 <= resp.status_code < 500, resp.text


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [10**30]},
        {"input_ids": [-1]},
        {"input_ids": [1], "max_tokens": 10**30},
        {"input_ids": [1], "top_k": 10**30},
        {"input_ids": [1], "seed": 10**30},
        {"input_ids": [1], "stop_token_ids": [10**30]},
        {"input_ids": [1], "return_logprob": True, "top_logprobs_num": 10**30},
        {"input_ids": [1, 2], "return_logprob": True, "max_tokens": 0, "logprob_start_len": 10**30},
        {"input_ids": [1], "temperature": 1e308, "top_p": 1e-308},
        {"input_ids": [], "prompt": ""},
        {"prompt": ""},
        {"input_ids": []},
        {"input_ids": [1], "image_data": {"url": "x"}},
        {"input_ids": [1], "future_field": [1, 2], "sampling_params": {"temperature": 0}},
        {},
    ],
)
async def test_hostile_values_never_5xx(body):
    for stream in (False, True):
        resp = await post(FakeBackend(), {**body, "stream": stream})
        assert resp.status_code < 500, resp.text


async def test_fields_that_change_nothing_are_accepted():
    body = {"input_ids": [1], "max_tokens": 1, "session_id": 3, "lora_path": None,
            "spaces_between_special_tokens": False, "repetition_penalty": 1.0, "return_routed_experts": False}
    resp = await post(FakeBackend(), body)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("field, value", [("logprob_start", 3), ("max_new_tokens", 4), ("return_logprobs", True),
                                          ("frequency_penalty", 0.0)])
async def test_unknown_fields_are_a_400_naming_them(field, value):
    backend = FakeBackend()
    resp = await post(backend, {"input_ids": [1, 2], "max_tokens": 0, "return_logprob": True,
                                "logprob_start_len": 0, field: value})
    assert resp.status_code == 400, resp.text
    assert f"Unknown field `{field}`" in resp.json()["message"]  # the seed's errors keep `param` null
    assert backend.requests == []


@pytest.mark.parametrize("field, value", [("repetition_penalty", 1.2), ("return_routed_experts", True),
                                          ("repetition_penalty", True)])
async def test_lmdeploy_fields_that_change_the_answer_are_refused(field, value):
    resp = await post(FakeBackend(), {"input_ids": [1], "max_tokens": 1, field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith(f"`{field}`=")


async def test_worker_rejection_after_tokenizing_is_a_400():
    message = "The prompt length 600 plus max_tokens 128 exceeds the model's context length 512."

    def script(req):
        yield RequestOutput(
            request_id=req.rid, finished=True, finish_reason=FinishReason(type="error", message=message, code=400)
        )

    for stream in (False, True):
        resp = await post(FakeBackend(script), {"prompt": "long text", "stream": stream})
        assert resp.status_code == 400 and resp.json() == error_body(message)


@pytest.mark.parametrize("code", [500, None])
async def test_engine_failure_before_any_byte_is_500(code):
    def script(req):
        yield RequestOutput(
            request_id=req.rid,
            finished=True,
            finish_reason=FinishReason(type="error", message="engine failure", code=code),
        )

    for stream in (False, True):
        resp = await post(FakeBackend(script), {"input_ids": [1], "stream": stream})
        assert resp.status_code == 500
        assert resp.json() == {
            "object": "error",
            "message": "engine failure",
            "type": "server_error",
            "code": 500,
            "param": None,
        }


async def test_engine_failure_mid_generation():
    def script(req):
        yield from list(fake_model(req))[:2]
        yield RequestOutput(
            request_id=req.rid,
            finished=True,
            finish_reason=FinishReason(type="error", message="engine failure", code=500),
        )

    resp = await post(FakeBackend(script), {"input_ids": [1], "max_tokens": 5})
    assert resp.status_code == 500 and resp.json()["message"] == "engine failure"
    evs = events(await post(FakeBackend(script), {"input_ids": [1], "max_tokens": 5, "stream": True}))
    assert len(evs) == 4 and evs[1]["output_ids"] == [3]
    assert evs[2]["meta_info"]["finish_reason"] == {"type": "error", "message": "engine failure"}


async def test_abort_finish_passes_through():
    def script(req):
        yield RequestOutput(request_id=req.rid, finished=True, finish_reason=FinishReason(type="abort"))

    resp = await post(FakeBackend(script), {"input_ids": [1]})
    assert resp.status_code == 200 and resp.json()["meta_info"]["finish_reason"] == {"type": "abort"}


# --- worker failures ----------------------------------------------------------------------------------


async def test_no_worker_is_503():
    backend = FakeBackend()
    backend.info = RuntimeError("no replicas")
    resp = await post(backend, {"input_ids": [1]})
    assert resp.status_code == 503
    body = resp.json()
    assert body["object"] == "error" and body["code"] == 503 and body["param"] is None


@pytest.mark.parametrize("stream", [False, True])
async def test_worker_dies_before_first_chunk_is_503(stream):
    backend = FakeBackend(lambda req: [RuntimeError("actor died")])
    resp = await post(backend, {"input_ids": [1], "stream": stream})
    assert resp.status_code == 503 and resp.json()["code"] == 503


async def test_worker_dies_mid_request_non_streaming_is_503():
    def script(req):
        yield from list(fake_model(req))[:2]
        yield RuntimeError("actor died")

    resp = await post(FakeBackend(script), {"input_ids": [1], "max_tokens": 5})
    assert resp.status_code == 503


async def test_worker_dies_mid_stream_ends_with_error_event():
    def script(req):
        yield from list(fake_model(req))[:2]
        yield RuntimeError("actor died")

    resp = await post(
        FakeBackend(script), {"input_ids": [1], "max_tokens": 5, "stream": True, "return_logprob": True}
    )
    evs = events(resp)
    assert len(evs) == 4  # two deltas, the error event, [DONE]
    last = evs[2]
    assert last["meta_info"]["finish_reason"]["type"] == "error"
    assert "RuntimeError" in last["meta_info"]["finish_reason"]["message"]
    assert last["output_ids"] == [] and last["text"] == ""
    assert (
        last["meta_info"]["output_token_logprobs"] == [] and last["meta_info"]["input_token_logprobs"] is None
    )
    assert last["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_stream_ending_without_final_chunk_never_hangs(stream):
    backend = FakeBackend(lambda req: list(fake_model(req))[:2])
    resp = await asyncio.wait_for(post(backend, {"input_ids": [1], "max_tokens": 5, "stream": stream}), 5)
    if stream:
        assert events(resp)[-2]["meta_info"]["finish_reason"]["type"] == "error"
    else:
        assert resp.status_code == 503


@pytest.mark.parametrize("stream", [False, True])
async def test_nothing_read_after_the_final_chunk(stream):
    backend = FakeBackend(lambda req: [*fake_model(req), HANG])
    resp = await asyncio.wait_for(post(backend, {"input_ids": [1], "max_tokens": 2, "stream": stream}), 5)
    assert resp.status_code == 200 and backend.aborted == []


# --- other routes -------------------------------------------------------------------------------------


async def test_health():
    backend = FakeBackend()
    async with client(backend) as c:
        assert (await c.get("/health")).status_code == 200
        backend.is_ready = False
        resp = await c.get("/health")
        assert resp.status_code == 503 and resp.json() == {"status": "unavailable"}


async def test_openapi_and_docs():
    async with client(FakeBackend()) as c:
        spec = (await c.get("/openapi.json")).json()
        assert {"/generate", "/health"} <= set(spec["paths"])
        shapes = spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
        props = next(shape for shape in shapes if shape["title"] == "GenerateBody")["properties"]
        assert {"input_ids", "prompt", "logprob_start_len", "top_logprobs_num", "rid"} <= set(props)
        assert (await c.get("/docs")).status_code == 200
