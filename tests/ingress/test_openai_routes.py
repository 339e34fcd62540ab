"""The OpenAI-compatible routes over a fake backend: shapes, logprobs layout, batches, streaming, errors.

No Ray: the app of `build_fastapi_app` over the fake worker of tests/helpers/openai_fakes.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ingress.app import build_fastapi_app
from protocol import FinishReason, ModelInfo, RequestOutput
from tests.helpers.fakes import HANG, RawCall
from tests.helpers.openai_fakes import Backend, call, complete, error, model, sse, value

# --- what lm-eval sends -------------------------------------------------------------------------------

LM_EVAL = {"model": "tiny", "prompt": [[40, 41, 42, 43]], "temperature": 0, "max_tokens": 1, "logprobs": 1,
           "seed": 1234, "echo": True}


async def test_lm_eval_request_scores_prompt_and_generates_one_token():
    backend = Backend()
    resp = await complete(LM_EVAL, backend)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["text"] == "HIJK" + "L"  # the echoed prompt, then the generated token
    lp = choice["logprobs"]
    assert lp["tokens"] == ["H", "I", "J", "K", "L"]
    assert lp["token_logprobs"] == [None, value(1, 41), value(2, 42), value(3, 43), value(4, 44)]
    # top-1 ({text of id 0: -0.0}) plus the actual token; position 0 has none
    assert lp["top_logprobs"] == [None] + [{" ": -0.0, t: v}
                                           for t, v in zip("IJKL", lp["token_logprobs"][1:], strict=True)]
    assert lp["text_offset"] == [0, 1, 2, 3, 4]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    (req,) = backend.requests
    # One engine request both scores the prompt (from position 0) and generates: what /generate forbids.
    p = req.params
    assert (req.input_ids, p.logprob_start_len, p.max_tokens, p.return_logprob, p.top_logprobs_num,
            p.temperature, p.seed) == ([40, 41, 42, 43], 0, 1, True, 1, 0, 1234)


async def test_what_lm_eval_sums():
    """lm-eval's local-completions sums token_logprobs[ctxlen:-1]: the continuation's prompt rows."""
    choice = (await complete(LM_EVAL)).json()["choices"][0]
    ctxlen = 2
    assert sum(choice["logprobs"]["token_logprobs"][ctxlen:-1]) == value(2, 42) + value(3, 43)


async def test_echo_max_tokens_0_is_the_prompt_only():
    backend = Backend()
    resp = await complete({**LM_EVAL, "max_tokens": 0, "logprobs": 0}, backend)
    choice = resp.json()["choices"][0]
    assert choice["text"] == "HIJK" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"] == [None, value(1, 41), value(2, 42), value(3, 43)]
    assert choice["logprobs"]["top_logprobs"] == [None, {"I": value(1, 41)}, {"J": value(2, 42)}, {"K": value(3, 43)}]
    assert resp.json()["usage"]["completion_tokens"] == 0
    assert backend.requests[0].params.max_tokens == 0 and backend.requests[0].params.logprob_start_len == 0


@pytest.mark.parametrize("body", [
    {"prompt": "H", "max_tokens": 0, "echo": True, "logprobs": 2},  # one token: nothing to score
    {"prompt": "HIJ", "max_tokens": 0, "echo": True},  # no logprobs asked for
])
async def test_echo_with_nothing_to_compute_never_reaches_the_worker(body):
    backend = Backend()
    resp = await complete(body, backend)
    assert resp.status_code == 200 and backend.requests == []
    choice = resp.json()["choices"][0]
    assert choice["text"] == body["prompt"] and choice["finish_reason"] == "length"
    if "logprobs" in body:
        assert choice["logprobs"] == {"tokens": ["H"], "token_logprobs": [None], "top_logprobs": [None],
                                      "text_offset": [0]}
    else:
        assert choice["logprobs"] is None


async def test_generation_without_echo_or_logprobs():
    backend = Backend()
    body = (await complete({"prompt": "AB", "max_tokens": 3, "stop": "x"}, backend)).json()
    assert body["choices"] == [{"index": 0, "text": "CDE", "logprobs": None, "finish_reason": "length"}]
    req = backend.requests[0]
    p = req.params
    assert p.logprob_start_len == -1 and not p.return_logprob and p.stop == ["x"]
    assert req.input_ids == [33, 34] and p.temperature == 1.0 and p.max_tokens == 3


async def test_logprobs_without_echo_cover_the_completion_only():
    choice = (await complete({"prompt": "AB", "max_tokens": 2, "logprobs": 0})).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == ["C", "D"] and choice["logprobs"]["text_offset"] == [0, 1]
    assert choice["logprobs"]["token_logprobs"] == [value(2, 35), value(3, 36)]


async def test_default_max_tokens_is_16():
    backend = Backend()
    await complete({"prompt": "A"}, backend)
    assert backend.requests[0].params.max_tokens == 16


# --- batches -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt", [[[40, 41], [50, 51, 52], [60]], ["HI", "RST", "\\"]])
async def test_batch_has_one_choice_per_prompt_in_order(prompt):
    backend = Backend()
    body = (await complete({"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1}, backend)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == ["HIJ", "RSTU", "\\]"]
    assert [len(c["logprobs"]["tokens"]) for c in body["choices"]] == [3, 4, 2]
    assert body["choices"][2]["logprobs"]["token_logprobs"] == [None, value(1, 61)]
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}
    assert len({r.rid for r in backend.requests}) == 3
    assert backend.token_text_calls == 1  # one tokenizer call for every token text of the answer


# --- streaming -----------------------------------------------------------------------------------------

async def test_stream_chunks_concatenate_to_the_answer():
    body = {"prompt": [[40, 41, 42], [50]], "max_tokens": 3, "echo": True, "logprobs": 2}
    whole = (await complete(body)).json()
    chunks = sse(await complete({**body, "stream": True}))
    assert all(c["object"] == "text_completion" and len(c["choices"]) == 1 and "usage" not in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert [m["finish_reason"] for m in mine] == [None] * (len(mine) - 1) + ["length"]
        assert "".join(m["text"] for m in mine) == choice["text"]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert sum((m["logprobs"][key] for m in mine), []) == choice["logprobs"][key]


async def test_stream_usage_chunk_when_asked():
    chunks = sse(await complete({"prompt": "AB", "max_tokens": 2, "stream": True,
                                 "stream_options": {"include_usage": True}}))
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 4


async def test_stream_failure_mid_way_is_an_error_event_then_done():
    def dies(req):
        yield from list(model(req))[:1]
        raise RuntimeError("boom")

    chunks = sse(await complete({"prompt": "AB", "max_tokens": 3, "stream": True}, Backend(dies)))
    assert chunks[0]["choices"][0]["text"] == "C"
    assert chunks[-1]["error"]["type"] == "server_error" and "RuntimeError" in chunks[-1]["error"]["message"]


# --- errors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "A", "n": 2}, "n", "one choice per prompt"),
    ({"prompt": "A", "best_of": 3}, "best_of", "Only null or 1 is accepted"),
    ({"prompt": "A", "logprobs": -1}, "logprobs", "non-negative"),
    ({"prompt": "A", "max_tokens": 0}, "max_tokens", "requires echo"),
    ({"prompt": "A", "max_tokens": -1}, "max_tokens", "non-negative"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": []}, "prompt", "must not be empty"),
    ({"prompt": [[1], []]}, "prompt", "index 1"),
    ({"prompt": ["a", ""]}, "prompt", "index 1"),
    ({"prompt": [1, 100]}, "prompt", "token id 100"),
    ({"prompt": [[1], [-1]]}, "prompt", "index 1 holds token id -1"),
    ({"prompt": [1] * 60, "max_tokens": 5}, "prompt", "context length 64"),
    ({"prompt": "A", "temperature": -1}, "temperature", "non-negative"),
    ({"prompt": "A", "top_p": 0}, "top_p", "(0, 1]"),
    ({"prompt": "A", "seed": -5}, "seed", "must be in"),
    ({"prompt": "A", "seed": 10**30}, "seed", "must be in"),
    ({"prompt": "A", "stop": ["x", ""]}, "stop", "must not be empty"),
    ({"prompt": "A", "stop_token_ids": [100]}, "stop_token_ids", "out of range"),
    ({"prompt": "A", "suffix": "z"}, "suffix", "not supported"),
    ({"prompt": "A", "logit_bias": {"5": 1.0}}, "logit_bias", "not supported"),
    ({"prompt": "A", "presence_penalty": 0.5}, "presence_penalty", "Only null or 0 or 0.0"),
    ({"prompt": "A", "stream_options": {"include_usage": True}}, "stream_options", "requires stream"),
])
async def test_rules_are_400_with_openai_shape(body, param, words):
    backend = Backend()
    message = error(await complete(body, backend), 400, param)
    assert words in message
    assert backend.requests == []


async def test_other_model_is_404_that_names_ours():
    message = error(await complete({"model": "gpt-4", "prompt": "A"}), 404, "model")
    assert "`gpt-4`" in message and "`tiny`" in message


async def test_logprobs_need_raw_logprobs_mode():
    backend = Backend()
    backend.info = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=64, logprobs_mode="raw_logits")
    assert "raw_logprobs" in error(await complete({"prompt": "A", "logprobs": 1}, backend), 400, "logprobs")


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[1], ["a"]]}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": "A", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "A", "echo": 1}, "echo"),
    ({"prompt": "A", "temperature": float("nan")}, "temperature"),
    ({"max_tokens": 1}, "prompt"),
    ([1, 2], None),
])
async def test_shape_errors_are_422_with_openai_shape(body, param):
    raw = json.dumps(body)  # json.dumps writes NaN, which Python's parser (FastAPI's) accepts
    error(await call(Backend(), "POST", "/v1/completions", raw), 422, param)


@pytest.mark.parametrize("raw", [
    b"{not json", b"", b"null", b'{"prompt": "A", "logprobs": 1e400}', b"\xff\xfe\x00garbage",
    b'{"prompt": [' + b"9" * 5000 + b"]}", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
])
async def test_malformed_bodies_are_4xx(raw):
    resp = await call(Backend(), "POST", "/v1/completions", raw)
    assert 400 <= resp.status_code < 500, resp.text


@pytest.mark.parametrize("body", [
    {"prompt": [10**30]}, {"prompt": [[1], [10**30]]}, {"prompt": "A", "max_tokens": 10**30},
    {"prompt": "A", "logprobs": 10**30}, {"prompt": "A", "top_k": 10**30}, {"prompt": "A", "n": 10**30},
    {"prompt": "A", "temperature": 1e308, "top_p": 1e-308}, {"prompt": "A", "stop_token_ids": [10**30]},
    {"prompt": "A", "max_tokens": None, "n": None, "logprobs": None, "echo": None, "temperature": None,
     "top_p": None, "stream": None, "stop": None, "seed": None, "best_of": None},
    {"prompt": "A", "future_field": [1], "user": "u"}, {"prompt": "A", "echo": True, "max_tokens": 0, "logprobs": 20},
    {},
])
async def test_hostile_values_never_5xx(body):
    for stream in (False, True):
        resp = await complete({**body, "stream": stream})
        assert resp.status_code < 500, resp.text


@pytest.mark.parametrize("code, status, kind", [(400, 400, "invalid_request_error"), (500, 500, "server_error")])
async def test_worker_error_before_any_byte(code, status, kind):
    def rejects(req):
        yield RequestOutput(request_id=req.rid, finished=True,
                            finish_reason=FinishReason("error", message="no", code=code))

    for stream in (False, True):
        resp = await complete({"prompt": [[1], [2]], "stream": stream}, Backend(rejects))
        error(resp, status)
        assert resp.json()["error"]["type"] == kind


async def test_no_worker_is_503():
    backend = Backend()
    backend.info = RuntimeError("no replicas")
    for method, path, body in [("POST", "/v1/completions", {"prompt": "A"}), ("GET", "/v1/models", None),
                               ("POST", "/tokenize", {"prompt": "A"}), ("POST", "/detokenize", {"tokens": [1]})]:
        assert error(await call(backend, method, path, body), 503).startswith("The worker failed")


async def test_one_failing_prompt_aborts_the_others():
    def first_fails(req):
        if req.input_ids == [1]:
            raise RuntimeError("dead")
        yield from [HANG]

    backend = Backend(first_fails)
    error(await complete({"prompt": [[1], [2]], "max_tokens": 2}, backend), 503)
    assert backend.aborted == [backend.requests[1].rid]


async def test_disconnect_aborts_every_prompt():
    backend = Backend(lambda req: [HANG])
    raw = RawCall(build_fastapi_app(backend), {"prompt": [[1], [2]], "max_tokens": 3})
    raw.scope["path"], raw.scope["raw_path"] = "/v1/completions", b"/v1/completions"
    task = raw.run()
    await asyncio.wait_for(backend.started.wait(), 5)
    await asyncio.sleep(0.05)
    raw.gone.set()
    await asyncio.wait_for(task, 5)
    assert sorted(backend.aborted) == sorted(r.rid for r in backend.requests) and len(backend.requests) == 2


# --- models and tokenizer ------------------------------------------------------------------------------

async def test_models():
    body = (await call(Backend(), "GET", "/v1/models")).json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
    assert body["data"][0]["object"] == "model" and body["data"][0]["max_model_len"] == 64


async def test_tokenize_and_detokenize_round_trip():
    backend = Backend()
    tok = (await call(backend, "POST", "/tokenize", {"prompt": "HI", "add_special_tokens": False})).json()
    assert tok == {"tokens": [40, 41], "count": 2, "max_model_len": 64}
    assert (await call(backend, "POST", "/tokenize", {"prompt": "HI"})).json()["tokens"] == [40, 41]
    assert (await call(backend, "POST", "/detokenize", {"tokens": [40, 41]})).json() == {"prompt": "HI"}
    assert "out of range" in error(await call(backend, "POST", "/detokenize", {"tokens": [100]}), 400, "tokens")
    error(await call(backend, "POST", "/tokenize", {"prompt": "A", "model": "other"}), 404, "model")
    error(await call(backend, "POST", "/tokenize", {"text": "A"}), 422, "prompt")


async def test_tokenizer_info_has_what_lm_eval_probes():
    info = (await call(Backend(), "GET", "/tokenizer_info")).json()
    assert info["eos_token"] == "~" and info["chat_template"] == "{{ messages }}" and info["bos_token"] is None


async def test_openapi_lists_the_routes():
    paths = (await call(Backend(), "GET", "/openapi.json")).json()["paths"]
    assert {"/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info", "/generate"} <= set(paths)
