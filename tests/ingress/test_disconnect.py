"""A client that goes away aborts its worker request: streaming or not, mid-prefill or mid-stream, whether
the server tells the app (http.disconnect) or cancels its task (what Ray Serve does).

Raw ASGI calls, so each test chooses the moment the client leaves; the fake backend records every stream
closed or cancelled before its final chunk.
"""

from __future__ import annotations

import asyncio

import pytest

from ingress.app import build_fastapi_app
from tests.helpers.fakes import HANG, SCORE, FakeBackend, RawCall, fake_model, post


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_streaming_disconnect_mid_stream_aborts(spec_version):
    backend = FakeBackend(lambda req: [next(iter(fake_model(req))), HANG])
    call = RawCall(
        build_fastapi_app(backend), {"input_ids": [1], "max_tokens": 5, "stream": True}, spec_version
    )
    task = call.run()
    await asyncio.wait_for(call.first_body.wait(), 5)
    call.gone.set()
    await asyncio.wait_for(task, 5)
    assert backend.aborted == [backend.requests[0].rid]


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_streaming_disconnect_of_a_stalled_client_aborts(spec_version):
    # The worker is fast, the client stopped reading: the stream is parked on a write, the worker's
    # generator on a yield, and neither sees the cancellation unless the response closes the stream.
    backend = FakeBackend()
    call = RawCall(
        build_fastapi_app(backend), {"input_ids": [1], "max_tokens": 50, "stream": True}, spec_version
    )
    call.stalled = True
    task = call.run()
    await asyncio.wait_for(call.first_body.wait(), 5)
    await asyncio.sleep(0.05)
    call.gone.set()
    await asyncio.wait_for(task, 5)
    assert backend.aborted == [backend.requests[0].rid]


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_during_prefill_aborts(stream):
    # A long scoring prefill: nothing has been produced yet when the client leaves.
    backend = FakeBackend(lambda req: [HANG])
    call = RawCall(build_fastapi_app(backend), {**SCORE, "stream": stream})
    task = call.run()
    await asyncio.wait_for(backend.started.wait(), 5)
    call.gone.set()
    await asyncio.wait_for(task, 5)
    assert backend.aborted == [backend.requests[0].rid]
    assert not any(m.get("body") for m in call.sent)  # nothing was answered to nobody


async def test_non_streaming_disconnect_mid_generation_aborts():
    backend = FakeBackend(lambda req: [*list(fake_model(req))[:2], HANG])
    call = RawCall(build_fastapi_app(backend), {"input_ids": [1], "max_tokens": 5})
    task = call.run()
    await asyncio.wait_for(backend.started.wait(), 5)
    await asyncio.sleep(0.05)
    call.gone.set()
    await asyncio.wait_for(task, 5)
    assert backend.aborted == [backend.requests[0].rid]


@pytest.mark.parametrize("stream", [False, True])
async def test_cancelled_handler_aborts(stream):
    # What Ray Serve does when the client goes away: it cancels the replica's handler task.
    backend = FakeBackend(lambda req: [next(iter(fake_model(req))), HANG])
    call = RawCall(build_fastapi_app(backend), {"input_ids": [1], "max_tokens": 5, "stream": stream})
    task = call.run()
    await asyncio.wait_for(backend.started.wait(), 5)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert backend.aborted == [backend.requests[0].rid]


async def test_completed_requests_are_not_aborted():
    backend = FakeBackend()
    for stream in (False, True):
        await post(backend, {"input_ids": [1], "max_tokens": 3, "stream": stream})
        await post(backend, {**SCORE, "stream": stream})
    assert len(backend.requests) == 4 and backend.aborted == []
