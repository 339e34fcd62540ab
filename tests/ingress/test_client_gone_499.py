"""A client that leaves is a 499 in the access log and the metrics, never a 500: Serve cancels the task of a request
whose client disconnected (a /health probe that timed out, a client that gave up on a queued request), and the
cancellation used to be logged as `status=500` with a CancelledError traceback, which alerting counts as a server
error. Driven as Serve drives it: the ASGI call's task is cancelled while the route awaits its backend."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from ingress.app import build_fastapi_app
from ingress.edge.metrics import rejection_reason
from ingress.edge.request_record import RequestRecord
from tests.helpers.fakes import SCORE, FakeBackend


class StalledBackend(FakeBackend):
    """A worker that never answers `ready` (a probe that times out) nor model_info (a queued request)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def ready(self) -> bool:
        self.entered.set()
        await asyncio.Event().wait()
        return True

    async def model_info(self):  # noqa: ANN201
        self.entered.set()
        await asyncio.Event().wait()


async def cancel_mid_request(method: str, path: str, body: bytes, caplog: pytest.LogCaptureFixture
                             ) -> tuple[RequestRecord, list[logging.LogRecord], list[dict]]:
    backend, records, sent = StalledBackend(), [], []
    app = build_fastapi_app(backend, on_request=records.append)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": b"",
             "headers": [(b"host", b"test"), (b"x-request-id", b"probe-1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client says nothing more; Serve cancels instead
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    caplog.set_level(logging.INFO, logger="ray.serve")
    task = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(backend.entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = records
    return record, [r for r in caplog.records if "probe-1" in r.getMessage()], sent


@pytest.mark.parametrize("method, path, body", [("GET", "/health", b""),
                                                ("POST", "/generate", json.dumps(SCORE).encode()),
                                                ("POST", "/v1/completions", b'{"prompt": "A", "max_tokens": 1}')])
async def test_cancelled_request_is_499_without_traceback(method: str, path: str, body: bytes,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    record, logs, sent = await cancel_mid_request(method, path, body, caplog)
    assert record.status == 499 and rejection_reason(record) is None  # not a refusal, not a failure
    assert sent == []  # nothing was answered
    (line,) = logs
    assert "status=499" in line.getMessage() and line.levelno == logging.INFO
    assert line.exc_info is None and "failed" not in line.getMessage()
