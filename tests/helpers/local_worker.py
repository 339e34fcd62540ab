"""The real ingress (HandleBackend, its own tokenizer) over a real EngineWorker in this process, without Ray: what a
route's exactness tests need when the point is the dialect's parse and render on the engine's true values, not the
cluster (tests/e2e has those)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from ingress.app import build_fastapi_app
from ingress.transport import HandleBackend
from workers.worker import EngineWorker

_closing: set[asyncio.Future[None]] = set()
# Every streaming call's generator, held as Serve's replica holds its task: a stream the ingress stops reading without
# cancelling it is not ended by garbage collection here either (it would hide a missing cancel).
_streams: list[Any] = []


class _Call:
    """A DeploymentResponse (awaitable) or DeploymentResponseGenerator (async iterable) over a direct call."""

    def __init__(self, result: Any) -> None:
        self._result = result
        if hasattr(result, "aclose"):
            _streams.append(result)

    def __await__(self):  # noqa: ANN204
        return self._result.__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._result.__aiter__()

    def cancel(self) -> None:
        """As Serve's: the worker's `generate` is ended at its current await, which aborts the request in the engine
        (a unary call's coroutine has nothing left to end once awaited)."""
        if hasattr(self._result, "aclose"):
            with contextlib.suppress(ValueError):
                _streams.remove(self._result)
            task = asyncio.ensure_future(self._result.aclose())
            _closing.add(task)  # held until done: the loop keeps only a weak reference to a task
            task.add_done_callback(_closing.discard)


class _Method:
    def __init__(self, worker: EngineWorker, name: str) -> None:
        self._worker, self._name = worker, name

    def remote(self, *args: Any) -> _Call:
        return _Call(getattr(self._worker, self._name)(*args))


class LocalHandle:
    """The worker deployment's handle, calling the worker's methods in this process."""

    def __init__(self, worker: EngineWorker) -> None:
        self._worker = worker

    def options(self, **_: Any) -> LocalHandle:
        return self

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._worker, name)


def local_client(path: Path, **engine: Any) -> httpx.AsyncClient:
    """An HTTP client of the whole ingress app over one in-process worker on the checkpoint at `path` (float32)."""
    return client_of(EngineWorker({"model": str(path), "dtype": "float32", **engine}))


def client_of(worker: EngineWorker) -> httpx.AsyncClient:
    """An HTTP client of the whole ingress app over `worker` (a test that also looks into its engine)."""
    app = build_fastapi_app(HandleBackend(LocalHandle(worker)))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120)


async def engine_idle(worker: EngineWorker) -> None:
    """Wait until the worker's engine holds no request: a closed call's abort reaches the engine thread within a step
    or two (the close is asynchronous); AssertionError naming the requests still there after 10 s."""
    eng = worker.engine.engine
    for _ in range(200):
        if not eng.seqs and not eng.has_unfinished():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the engine still runs {list(eng.seqs)}")
