"""The whole application on a real local Ray cluster: ingress + two SmolLM2 workers, over HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch
from ray import serve

from tests.helpers.reference import hf_scores
from tests.helpers.rl import check_teacher, teacher
from tests.helpers.serve import app_args, deploy, ids_of, score_body, sse_events, worker_stats

APP = "e2e"
PREFIX = "/e2e"
ATOL = 1e-4


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    deploy(APP, PREFIX, app_args())
    yield serve_url + PREFIX
    serve.delete(APP)


@pytest.mark.parametrize("stream", [False, True])
def test_scoring_equals_transformers(url: str, smollm2_path, stream: bool) -> None:
    ids = ids_of(48, 1)
    for n in (0, 23, len(ids) - 2):
        r = httpx.post(url + "/generate", json=score_body(ids, n, stream=stream), timeout=120)
        assert r.status_code == 200, r.text
        if stream:
            events = sse_events(r)
            assert len(events) == 2 and events[1] == "[DONE]"  # exactly one data event
            body = events[0]
        else:
            body = r.json()
        meta = body["meta_info"]
        rows = meta["input_token_logprobs"]
        assert [t for _, t in rows] == ids[n + 1:]
        expected = hf_scores(smollm2_path, ids, n)
        assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
        assert body["text"] == "" and body["output_ids"] == [] and meta["completion_tokens"] == 0
        assert meta["finish_reason"] == {"type": "length"} and meta["prompt_tokens"] == len(ids)
        assert meta["output_token_logprobs"] is None and meta["output_top_logprobs"] is None
        assert meta["input_top_logprobs"] is None


def test_teacher_rows_at_a_temperature(url: str, smollm2_path) -> None:
    """RL / distillation: T = 0.7, top-20 and token ids equal transformers' log_softmax(logits / 0.7), cold and warm."""
    ids = ids_of(60, 9)
    for _ in range(2):
        check_teacher(httpx.post(url + "/generate", json=teacher(ids), timeout=120).json()["meta_info"],
                      smollm2_path, ids, "default")


def test_top_k_rows(url: str, smollm2_path) -> None:
    from tests.helpers.reference import hf_logits

    ids = ids_of(20, 2)
    body = httpx.post(url + "/generate", json=score_body(ids, 5, k=3), timeout=120).json()
    lp = torch.log_softmax(hf_logits(smollm2_path, ids), -1)
    for row, pos in zip(body["meta_info"]["input_top_logprobs"], range(5, 19), strict=True):
        v, i = torch.topk(lp[pos], 3)
        assert [t for _, t in row] == i.tolist()
        assert max(abs(a - b) for (a, _), b in zip(row, v.tolist(), strict=True)) <= ATOL


def test_generation_stream_concatenates_to_answer(url: str) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_logprob": True, "top_logprobs_num": 2}
    whole = httpx.post(url + "/generate", json=body, timeout=120).json()
    events = sse_events(httpx.post(url + "/generate", json={**body, "stream": True}, timeout=120))
    assert events[-1] == "[DONE]"
    data = events[:-1]
    assert all(e["meta_info"]["finish_reason"] is None for e in data[:-1])
    assert data[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert "".join(e["text"] for e in data) == whole["text"]
    assert sum((e["output_ids"] for e in data), []) == whole["output_ids"]
    lps = sum((e["meta_info"]["output_token_logprobs"] for e in data), [])
    assert [t for _, t in lps] == whole["output_ids"] and len(whole["output_ids"]) == 12
    assert max(abs(a - b) for (a, _), (b, _) in zip(lps, whole["meta_info"]["output_token_logprobs"],
                                                    strict=True)) <= ATOL
    assert " Paris" in whole["text"]


def test_no_logprobs_means_null(url: str) -> None:
    body = httpx.post(url + "/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=60).json()
    meta = body["meta_info"]
    assert all(meta[k] is None for k in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs",
                                         "output_top_logprobs"))


@pytest.mark.parametrize("body, status, message", [
    ({"input_ids": [1, 2], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 1},
     400, "logprob_start_len(1) exceeds the last scorable source position for input_ids length(2)."),
    ({"input_ids": [1, 49152], "max_tokens": 1}, 400, None),
    ({"input_ids": [1, -3], "max_tokens": 1}, 400, None),
    ({"input_ids": [10**30], "max_tokens": 1}, None, None),
    ({"prompt": "", "max_tokens": 1}, 400, "The prompt must not be an empty string"),
    ({"input_ids": [], "max_tokens": 1}, 400, "The input_ids must not be an empty list"),
    ({"input_ids": [1, 2], "max_tokens": 0}, 400, "The max_tokens 0 must be a positive integer."),
    ({"input_ids": [1] * 8000, "max_tokens": 500}, 400, None),
    ({"input_ids": "abc"}, 422, None),
])
def test_bad_input_is_4xx(url: str, body: dict, status: int | None, message: str | None) -> None:
    r = httpx.post(url + "/generate", json=body, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status
    if message is not None:
        assert r.json()["message"] == message


def test_text_prompt_too_long_after_tokenizing_is_400(url: str) -> None:
    r = httpx.post(url + "/generate", json={"prompt": "hello " * 8200, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400, r.text
    assert "8192" in r.json()["message"]


def test_malformed_json_is_4xx(url: str) -> None:
    r = httpx.post(url + "/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500


def test_health_and_docs(url: str) -> None:
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert "/generate" in httpx.get(url + "/openapi.json", timeout=30).json()["paths"]
    assert httpx.get(url + "/docs", timeout=30).status_code == 200


def test_32_concurrent_mixed_requests_on_two_workers(url: str, smollm2_path) -> None:
    before = {pid: st.requests_finished for pid, st in worker_stats(APP).items()}
    assert len(before) == 2
    greedy = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    ref_gen = httpx.post(url + "/generate", json=greedy, timeout=120).json()
    jobs = []

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(client.post(url + "/generate", json=body) for body in bodies))

    bodies = []
    for i in range(32):
        kind = i % 4
        if kind in (0, 1):
            ids = ids_of(16 + i, 100 + i)
            n = [0, len(ids) // 2, len(ids) - 2][i % 3]
            jobs.append(("score", ids, n))
            bodies.append(score_body(ids, n, k=i % 3, stream=kind == 1))
        else:
            jobs.append(("gen", None, None))
            bodies.append({**greedy, "stream": kind == 3})
    responses = asyncio.run(send_all())
    for (kind, ids, n), r in zip(jobs, responses, strict=True):
        assert r.status_code == 200, r.text
        is_stream = r.headers["content-type"].startswith("text/event-stream")
        if kind == "score":
            body = sse_events(r)[0] if is_stream else r.json()
            rows = body["meta_info"]["input_token_logprobs"]
            expected = hf_scores(smollm2_path, ids, n)
            assert [t for _, t in rows] == ids[n + 1:]
            assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
        else:
            if is_stream:
                data = sse_events(r)[:-1]
                assert sum((e["output_ids"] for e in data), []) == ref_gen["output_ids"]
            else:
                assert r.json()["output_ids"] == ref_gen["output_ids"]
    after = worker_stats(APP)
    served = {pid: after[pid].requests_finished - before[pid] for pid in before}
    assert all(v > 0 for v in served.values()), served


def _idle(app: str) -> bool:
    return all(st.running == 0 and st.waiting == 0 and st.kv_blocks_free == st.kv_blocks_total
               for st in worker_stats(app, samples=12).values())


def test_disconnect_mid_stream_frees_the_request(url: str) -> None:
    body = {"prompt": "Tell me a story", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "/generate", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert first
        busy = any(st.running > 0 for st in worker_stats(APP, samples=12).values())
        assert busy
    deadline = time.monotonic() + 20
    while not _idle(APP):
        assert time.monotonic() < deadline, "request still running after the client left"
        time.sleep(0.2)


def test_disconnect_non_streaming_frees_the_request(url: str) -> None:
    body = {"prompt": "Tell me a story", "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/generate", json=body, timeout=2.0)
    deadline = time.monotonic() + 20
    while not _idle(APP):
        assert time.monotonic() < deadline, "request still running after the client left"
        time.sleep(0.2)


def test_scoring_same_cold_and_warm_over_http(url: str, smollm2_path) -> None:
    """A context scored against several endings: warm answers come from cached blocks (cached_tokens > 0)
    and still equal the transformers forward."""
    ctx = ids_of(70, 77)
    for i, n in enumerate((0, 40, 70 + 6 - 2)):
        ids = ctx + ids_of(6, 300 + i)
        for _ in range(2):
            body = httpx.post(url + "/generate", json=score_body(ids, n), timeout=120).json()
            rows = body["meta_info"]["input_token_logprobs"]
            expected = hf_scores(smollm2_path, ids, n)
            assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
    # Blocks of 16: the 70-token context holds 4 full blocks. Of 3 identical requests over 2 workers, two
    # reach the same worker, and the later of those is served from its cache whatever the routing.
    cached = [httpx.post(url + "/generate", json=score_body(ctx + ids_of(6, 300), 0), timeout=120).json()[
        "meta_info"]["cached_tokens"] for _ in range(3)]
    assert max(cached) >= 64, cached


def test_a_batch_not_streamed_is_one_call_and_equals_its_stream(url: str, smollm2_path) -> None:
    """A /generate batch without `stream` goes to the worker in one unary call (generate_whole): its answers are
    those of the streamed batch (a generation's deltas merged), in order, and the scores equal transformers'."""
    ctx = ids_of(40, 91)
    endings = [ids_of(8, 400 + i) for i in range(3)]
    batch = {"input_ids": [ctx + e for e in endings], "max_tokens": 0, "return_logprob": True,
             "logprob_start_len": 39}
    answers = httpx.post(url + "/generate", json=batch, timeout=120).json()
    assert len(answers) == 3
    for ids, answer in zip(batch["input_ids"], answers, strict=True):
        rows = answer["meta_info"]["input_token_logprobs"]
        assert [t for _, t in rows] == ids[40:]
        expected = hf_scores(smollm2_path, ids, 39)
        assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
    gen = {"input_ids": [ctx, ctx + endings[0]], "max_tokens": 5, "temperature": 0, "return_logprob": True}
    r = httpx.post(url + "/generate", json=gen, timeout=120)
    assert r.status_code == 200, r.text
    events = [e for e in sse_events(httpx.post(url + "/generate", json={**gen, "stream": True}, timeout=120))
              if e != "[DONE]"]
    for i, answer in enumerate(r.json()):
        mine = [e for e in events if e["index"] == i]
        assert answer["output_ids"] == [t for e in mine for t in e["output_ids"]]
        assert answer["text"] == "".join(e["text"] for e in mine)
        rows = answer["meta_info"]["output_token_logprobs"]
        streamed = [r for e in mine for r in e["meta_info"]["output_token_logprobs"]]
        assert len(rows) == 5 and [t for _, t in rows] == [t for _, t in streamed]
        assert max(abs(a - b) for (a, _), (b, _) in zip(rows, streamed, strict=True)) <= ATOL  # cached or not


def test_concurrent_single_scoring_requests_coalesce_and_stay_exact(url: str, smollm2_path) -> None:
    """48 concurrent one-prompt scoring requests, 6x the ingress's coalesce_max_in_flight (8): the ones that arrive
    while 8 calls are out go to the workers together (ingress/transport/coalesce.py), fewer worker calls than requests,
    and every answer is its own prompt's rows, equal to transformers."""
    before = worker_stats(APP, samples=48)
    prompts = [(ids_of(24 + i % 9, 700 + i), i % 5) for i in range(48)]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(client.post(url + "/generate", json=score_body(ids, n))
                                          for ids, n in prompts))

    responses = asyncio.run(send_all())
    for (ids, n), r in zip(prompts, responses, strict=True):
        assert r.status_code == 200, r.text
        rows = r.json()["meta_info"]["input_token_logprobs"]
        assert [t for _, t in rows] == ids[n + 1:]
        expected = hf_scores(smollm2_path, ids, n)
        assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
    after = worker_stats(APP, samples=48)
    assert set(after) == set(before)
    calls = sum(after[p].whole_calls - before[p].whole_calls for p in before)
    held = sum(after[p].whole_requests - before[p].whole_requests for p in before)
    assert held == len(prompts)
    assert calls < len(prompts), (calls, held)
