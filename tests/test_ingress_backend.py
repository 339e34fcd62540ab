"""HandleBackend over a fake DeploymentHandle (no Ray): caching, cancellation, readiness; import hygiene."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from ingress.backend import HandleBackend
from workers.protocol import FinishInfo, GenerateChunk, GenerateRequest, ModelInfo

INFO = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=512, logprobs_mode="raw_logprobs")
HANG = object()


class FakeResponse:
    """Stands for DeploymentResponse (awaitable) and DeploymentResponseGenerator (async iterable)."""

    def __init__(self, items: list[object]) -> None:
        self.items = list(items)
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __await__(self):
        return self._next().__await__()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return await self._next()

    async def _next(self):
        item = self.items.pop(0)
        if item is HANG:
            await asyncio.Event().wait()
        if isinstance(item, BaseException):
            raise item
        return item


class FakeMethod:
    def __init__(self, *answers: list[object]) -> None:
        self.answers = list(answers)
        self.responses: list[FakeResponse] = []

    def remote(self, *args) -> FakeResponse:
        response = FakeResponse(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])
        self.responses.append(response)
        return response


class FakeHandle:
    def __init__(self, stream: bool = False) -> None:
        self.is_stream = stream
        self.model_info = FakeMethod([INFO])
        self.stats = FakeMethod([object()])
        self.generate = FakeMethod([])
        self._streaming: FakeHandle | None = None

    def options(self, stream: bool = False) -> FakeHandle:
        # Like Serve: a distinct handle whose calls stream; generate must be called through it.
        if self._streaming is None:
            self._streaming = FakeHandle(stream=stream)
        return self._streaming


def chunks(n: int) -> list[GenerateChunk]:
    out = [GenerateChunk(rid="r", output_ids=[i]) for i in range(n - 1)]
    return [
        *out,
        GenerateChunk(rid="r", output_ids=[n], finished=True, finish_reason=FinishInfo(type="length")),
    ]


REQ = GenerateRequest(rid="r", input_ids=[1])


async def test_model_info_is_cached_after_first_success():
    handle = FakeHandle()
    handle.model_info = FakeMethod([RuntimeError("no replica yet")], [INFO])
    backend = HandleBackend(handle)
    with pytest.raises(RuntimeError):
        await backend.model_info()
    assert await backend.model_info() == INFO
    assert await backend.model_info() == INFO
    assert len(handle.model_info.responses) == 2


async def test_stream_goes_through_the_streaming_handle_and_is_not_cancelled_when_complete():
    handle = FakeHandle()
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(chunks(3))
    got = [c async for c in backend.stream(REQ)]
    assert [c.output_ids for c in got] == [[0], [1], [3]]
    assert handle.generate.responses == []  # not through the unary handle
    assert handle.options(stream=True).is_stream
    assert not handle.options(stream=True).generate.responses[0].cancelled


async def test_closing_the_stream_early_cancels_the_worker_call():
    handle = FakeHandle()
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(chunks(5))
    stream = backend.stream(REQ)
    await anext(stream)
    await stream.aclose()
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_cancelling_the_consumer_cancels_the_worker_call():
    handle = FakeHandle()
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod([chunks(2)[0], HANG])

    async def consume():
        async for _ in backend.stream(REQ):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_worker_error_propagates_and_cancels():
    handle = FakeHandle()
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod([chunks(2)[0], RuntimeError("actor died")])
    with pytest.raises(RuntimeError):
        async for _ in backend.stream(REQ):
            pass
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_ready():
    handle = FakeHandle()
    assert await HandleBackend(handle).ready() is True
    handle.stats = FakeMethod([RuntimeError("dead")])
    assert await HandleBackend(handle).ready() is False
    handle.stats = FakeMethod([HANG])
    assert await HandleBackend(handle, ready_timeout_s=0.05).ready() is False
    assert handle.stats.responses[0].cancelled


def test_ingress_never_imports_the_engine():
    code = (
        "import sys, ingress.app, ingress.backend, ingress.deployment;"
        "bad = [m for m in sys.modules if m == 'engine' or m.startswith('engine.')];"
        "assert not bad, bad;"
        "from ray.serve.deployment import Deployment;"
        "from ingress.deployment import Ingress;"
        "assert isinstance(Ingress, Deployment);"
        "assert hasattr(Ingress.func_or_class, '__serve_build_asgi_app__')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
