"""Nothing lost when a worker dies: a request whose worker was lost before any byte went out runs again.

Unit tests over the fake backend for the lifecycle's policy (what is retried, what is not, the budget, the
counter) and for HandleBackend's mapping of Ray's errors; the proof is the real-Ray test
(tests/e2e/test_retries_served.py): a worker SIGKILLed under 32 in-flight scoring requests, every one answered
200 and exact.
"""

from __future__ import annotations

import time

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.errors import Overloaded, WorkerLost
from ingress.retry import RetryBudget, RetryCounter
from ingress.settings import IngressSettings
from ingress.transport import HandleBackend
from protocol import FinishReason, GenerateRequest, RequestOutput
from tests.helpers.fakes import SCORE, FakeBackend, FakeHandle, FakeMethod, FakeResponse, fake_model
from tests.helpers.serve import sse_events


def failing(times: int, exc: BaseException):
    """A script whose first `times` streams fail with `exc` before their first chunk."""
    calls = {"n": 0}

    def script(req: GenerateRequest):
        calls["n"] += 1
        if calls["n"] <= times:
            raise exc
        yield from fake_model(req)

    return script


def client(backend: FakeBackend, retries: RetryCounter | None = None, **settings) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, IngressSettings(**settings), retries)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_budget_backs_off_until_its_deadline() -> None:
    now = [0.0]
    budget = RetryBudget(1.0, clock=lambda: now[0])
    waits = []
    while (w := budget.next_wait()) is not None:
        waits.append(w)
        now[0] += w
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.3])  # doubling, the last cut at the deadline
    assert RetryBudget(0.0).next_wait() is None


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_lost_worker_is_retried_and_counted(stream: bool) -> None:
    backend = FakeBackend(failing(2, WorkerLost("The worker failed (ActorDiedError).")))
    retries = RetryCounter()
    async with client(backend, retries) as c:
        r = await c.post("/generate", json={**SCORE, "stream": stream})
    assert r.status_code == 200, r.text
    rows = (sse_events(r)[0] if stream else r.json())["meta_info"]["input_token_logprobs"]
    assert rows == [[-2.5, 5], [-3.0, 6]]
    assert retries.total == 2 and len(backend.requests) == 3


@pytest.mark.asyncio
async def test_a_lost_worker_mid_collect_reruns_the_whole_batch() -> None:
    """A non-streamed batch: one prompt's worker dies after its first chunk; nothing was sent, so the whole
    request runs again and the answer is complete."""
    calls = {"n": 0}

    def script(req: GenerateRequest):
        calls["n"] += 1
        chunks = list(fake_model(req))
        if calls["n"] == 1:
            yield chunks[0]
            raise WorkerLost("lost")
        yield from chunks

    backend = FakeBackend(script)
    async with client(backend) as c:
        r = await c.post("/v1/completions", json={"prompt": [[1, 2], [3, 4]], "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == ["<3><4><5>", "<5><6><7>"]


@pytest.mark.asyncio
async def test_past_the_retry_deadline_the_answer_is_503() -> None:
    backend = FakeBackend(failing(1000, WorkerLost("The worker failed while serving this request (ActorDiedError).")))
    async with client(backend, retry_deadline_s=0.3) as c:
        t0 = time.monotonic()
        r = await c.post("/generate", json=SCORE)
    assert r.status_code == 503 and "ActorDiedError" in r.json()["message"]
    assert r.headers["retry-after"] == "1"  # its replacement is on the way: the client may come back
    assert 0.3 <= time.monotonic() - t0 < 2
    assert 2 <= len(backend.requests) <= 5
    async with client(FakeBackend(failing(1, WorkerLost("lost"))), retry_deadline_s=0) as c:
        assert (await c.post("/generate", json=SCORE)).status_code == 503


@pytest.mark.asyncio
async def test_overload_is_503_with_retry_after_at_once_and_not_retried() -> None:
    def refused(req: GenerateRequest):
        yield RequestOutput(request_id=req.rid, finished=True, finish_reason=FinishReason(
            "error", message="The worker's queue is full (max_queued_requests).", code=503))

    for script in (refused, failing(1000, Overloaded("Serve's queue is full."))):
        backend = FakeBackend(script)
        async with client(backend) as c:
            t0 = time.monotonic()
            r = await c.post("/generate", json=SCORE)
            o = await c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
        assert time.monotonic() - t0 < 1
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["code"] == 503
        assert o.status_code == 503 and o.headers["retry-after"] == "1" and o.json()["error"]["code"] == 503
        assert len(backend.requests) == 2


@pytest.mark.asyncio
async def test_neither_a_4xx_nor_an_engine_error_nor_a_started_stream_is_retried() -> None:
    def engine_error(req: GenerateRequest):
        yield RequestOutput(request_id=req.rid, finished=True,
                            finish_reason=FinishReason("error", message="boom", code=500))

    def dies_after_first(req: GenerateRequest):
        yield next(iter(fake_model(req)))
        raise WorkerLost("lost")

    for script, status in ((engine_error, 500), (failing(5, RuntimeError("a bug")), 503)):
        backend = FakeBackend(script)
        async with client(backend) as c:
            assert (await c.post("/generate", json=SCORE)).status_code == status
        assert len(backend.requests) == 1
    backend = FakeBackend(dies_after_first)
    async with client(backend) as c:
        r = await c.post("/generate", json={"input_ids": [1, 2], "max_tokens": 3, "stream": True})
    assert sse_events(r)[-2]["meta_info"]["finish_reason"]["type"] == "error"
    assert len(backend.requests) == 1


@pytest.mark.asyncio
async def test_handle_backend_maps_ray_errors() -> None:
    from ray.exceptions import ActorDiedError, ActorUnavailableError
    from ray.serve.exceptions import BackPressureError

    for exc, kind in ((ActorDiedError(), WorkerLost), (ActorUnavailableError("gone", b"0" * 16), WorkerLost),
                      (BackPressureError(num_queued_requests=3, max_queued_requests=2), Overloaded)):
        handle = FakeHandle()
        handle.options(stream=True).generate = type(handle.generate)([exc])
        backend = HandleBackend(handle)  # type: ignore[arg-type]
        with pytest.raises(kind):
            await anext(backend.stream(GenerateRequest("r", input_ids=[1, 2])))
        handle.model_info = type(handle.generate)([exc])
        with pytest.raises(kind):
            await backend.model_info()

    class Refused(FakeResponse):  # as Serve's: cancel() fetches the routing result and re-raises its error
        def cancel(self) -> None:
            raise BackPressureError(num_queued_requests=1, max_queued_requests=1)

    class RefusingMethod(FakeMethod):
        def remote(self, *args: object) -> FakeResponse:
            return Refused([BackPressureError(num_queued_requests=1, max_queued_requests=1)])

    handle = FakeHandle()
    handle.options(stream=True).generate = RefusingMethod([])
    with pytest.raises(Overloaded):
        await anext(HandleBackend(handle).stream(GenerateRequest("r", input_ids=[1, 2])))  # type: ignore[arg-type]

    class RefusesAtOnce:  # Serve's router may raise from `.remote()` itself
        def remote(self, *args: object) -> None:
            raise BackPressureError(num_queued_requests=1, max_queued_requests=1)

    handle = FakeHandle()
    handle.options(stream=True).generate = RefusesAtOnce()
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    with pytest.raises(Overloaded):
        await anext(backend.stream(GenerateRequest("r", input_ids=[1, 2])))
    handle.model_info = RefusesAtOnce()  # the text side needs the model's folder first: no worker told it yet
    with pytest.raises(Overloaded):
        await backend.tokenize("x")
