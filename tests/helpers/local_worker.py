"""The real ingress (HandleBackend, its own tokenizer) over a real EngineWorker in this process, without Ray: what a
route's exactness tests need when the point is the dialect's parse and render on the engine's true values, not the
cluster (tests/e2e has those)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from ingress.app import build_fastapi_app
from ingress.backend import HandleBackend
from workers.worker import EngineWorker


class _Call:
    """A DeploymentResponse (awaitable) or DeploymentResponseGenerator (async iterable) over a direct call."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def __await__(self):  # noqa: ANN204
        return self._result.__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._result.__aiter__()

    def cancel(self) -> None:
        pass


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
    worker = EngineWorker({"model": str(path), "dtype": "float32", **engine})
    app = build_fastapi_app(HandleBackend(LocalHandle(worker)))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120)
