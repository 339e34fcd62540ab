"""Shared fakes for the ingress's unit tests (no Ray, no model): a worker backend that plays a script, a raw
ASGI call whose client leaves when a test says so, and a fake DeploymentHandle for HandleBackend.

A fake stands in for the worker only where a test is about the ingress itself; the proof that a feature
works is the end-to-end tests against a real local Ray cluster and real weights.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path

import httpx

from ingress.app import build_fastapi_app
from ingress.lifecycle import all_or_none
from ingress.settings import IngressSettings
from protocol import (
    DEFAULT_WEIGHT_VERSION,
    FinishReason,
    GenerateRequest,
    ModelInfo,
    RequestOutput,
    WeightUpdate,
    WeightUpdateResult,
    merge_outputs,
    until_finished,
)
from protocol.control import FlushCache, GenerationControl, Pause, Resume

INFO = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=512, logprobs_mode="raw_logprobs")
HANG = object()  # in a script: wait forever (a long prefill, a stuck worker)

Script = Iterable[object]  # RequestOutput | BaseException | HANG


def fake_model(req: GenerateRequest) -> Script:
    """A deterministic worker: scoring in one chunk; generation one token per chunk, id = prev + 1."""
    ids = req.input_ids
    lp = req.params.return_logprob
    k = req.params.top_logprobs_num
    if req.params.max_tokens == 0:
        rows = ids[req.params.logprob_start_len + 1 :]
        yield RequestOutput(
            request_id=req.rid,
            finished=True,
            finish_reason=FinishReason(type="length"),
            prompt_tokens=len(ids),
            input_token_logprobs=[[-0.5 * t, t] for t in rows],
            input_top_logprobs=[[[-0.1, j] for j in range(k)] for _ in rows] if k else None,
            # Each asked id's value is -id / 100 at every row: distinct per id, so a renderer's pick is visible.
            input_token_ids_logprobs=[[[-0.01 * t, t] for t in cands or []] for cands in
                                      req.params.row_token_ids(req.params.logprob_start_len, len(ids) - 2)]
            if req.params.asks_token_ids else None,
        )
        return
    tok = ids[-1]
    for i in range(req.params.max_tokens):
        tok = (tok + 1) % INFO.vocab_size
        last = i == req.params.max_tokens - 1
        yield RequestOutput(
            request_id=req.rid,
            text=f"<{tok}>",
            new_token_ids=[tok],
            finished=last,
            finish_reason=FinishReason(type="length") if last else None,
            prompt_tokens=len(ids),
            completion_tokens=i + 1,
            output_token_logprobs=[[-1.0, tok]] if lp else None,
            output_top_logprobs=([[[-1.0, tok]] * k] if k else []) if lp else None,
        )


class FakeBackend:
    """Backend whose stream plays a script, and records how each stream ended."""

    def __init__(self, script: Callable[[GenerateRequest], Script] = fake_model) -> None:
        self.script = script
        self.info: ModelInfo | Exception = INFO
        self.is_ready = True
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []  # rids whose stream was closed or cancelled before its final chunk
        self.started = asyncio.Event()  # set once a stream was entered
        self.weight_updates: list[WeightUpdate] = []
        self.controls: list[GenerationControl] = []
        self.version = DEFAULT_WEIGHT_VERSION
        self.pause_mode: str | None = None  # as the workers would report it after the controls recorded

    async def model_info(self) -> ModelInfo:
        if isinstance(self.info, Exception):
            raise self.info
        return self.info

    async def stream(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        self.requests.append(req)
        self.started.set()
        finished = False
        try:
            for item in self.script(req):
                if item is HANG:
                    await asyncio.Event().wait()
                elif isinstance(item, BaseException):
                    raise item
                else:
                    assert isinstance(item, RequestOutput)
                    finished = item.finished
                    yield item
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self.aborted.append(req.rid)
            raise

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[RequestOutput, None]]:
        """A stream per request, each closed on its own (HandleBackend's read one call: test_one_worker_call.py)."""
        return [self.stream(req) for req in reqs]

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        """Each script played to its final chunk and merged, as the worker's generate_whole does; cancelled (the
        client left), every script not finished is recorded as aborted."""
        async def whole(req: GenerateRequest) -> RequestOutput:
            chunks = await until_finished(self.stream(req))
            if not chunks:
                return RequestOutput(request_id=req.rid)  # a script with no final chunk: unfinished, as a lost stream
            return merge_outputs(chunks)

        return await all_or_none(whole(req) for req in reqs)

    async def ready(self) -> bool:
        return self.is_ready

    # The text side: one id per character (id = ord(c) - 32, printable ASCII in the fake's vocabulary of 100).
    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - 32 for c in text]

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        return [await self.tokenize(t) for t in texts]

    async def paused(self) -> str | None:
        return self.pause_mode

    # Weights: the real broadcast is the workers' (tests/e2e/test_weight_update.py); this one records the calls.
    async def update_weights(self, req: WeightUpdate) -> WeightUpdateResult:
        self.weight_updates.append(req)
        if not Path(req.model_path).is_dir():
            return WeightUpdateResult(False, f"The model_path {req.model_path!r} is not a checkpoint folder.")
        self.version = req.weight_version or self.version
        return WeightUpdateResult(True, "Succeeded to update model weights on 1 replica(s).", 0, self.version)

    async def weight_version(self) -> str:
        return self.version

    # LoRA adapters: an in-memory registry (the real one is a Ray actor: workers/adapter_registry.py).
    async def adapters(self) -> dict[str, str]:
        return dict(getattr(self, "adapter_paths", {}))

    async def load_adapter(self, name: str, path: str) -> str | None:
        paths = self.__dict__.setdefault("adapter_paths", {})
        if name in paths:
            return f"The adapter {name!r} is already loaded."
        paths[name] = path
        return None

    async def unload_adapter(self, name: str) -> bool:
        return self.__dict__.setdefault("adapter_paths", {}).pop(name, None) is not None

    # Generation controls: the real ones are the engine's and the registry's (tests/engine/test_pause.py,
    # tests/e2e/test_sglang_control.py); this one records the calls.
    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        if isinstance(op, FlushCache):
            return WeightUpdateResult(True, "Cache flushed.", 0, self.version)
        self.controls.append(op)
        if isinstance(op, Pause):
            self.pause_mode = op.mode
        elif isinstance(op, Resume):
            self.pause_mode = None
        return WeightUpdateResult(True, f"{type(op).__name__} done on 1 replica(s).",
                                  0 if isinstance(op, Resume) else 2, self.version)


def client(backend: FakeBackend, settings: IngressSettings | None = None) -> httpx.AsyncClient:
    app = build_fastapi_app(backend, settings)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def post(backend: FakeBackend, body: object, **kwargs) -> httpx.Response:
    async with client(backend) as c:
        if isinstance(body, (bytes, str)):
            return await c.post("/generate", content=body, **kwargs)
        return await c.post("/generate", json=body, **kwargs)


# A /generate body that scores ids[2:] of four ids.
SCORE = {"input_ids": [3, 4, 5, 6], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 1}

class RawCall:
    """One POST /generate as raw ASGI, so a test chooses when the client disconnects."""

    def __init__(self, app, body: dict, spec_version: str = "2.4") -> None:
        self.app = app
        self.body = json.dumps(body).encode()
        self.gone = asyncio.Event()
        self.sent: list[dict] = []
        self.first_body = asyncio.Event()
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": spec_version},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/generate",
            "raw_path": b"/generate",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1234),
            "server": ("test", 80),
        }
        self._body_sent = False
        self.stalled = (
            False  # when set, every body write after the first blocks: a client that stopped reading
        )

    async def receive(self) -> dict:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if self.stalled and self.first_body.is_set():
            await asyncio.Event().wait()
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.first_body.set()

    def run(self) -> asyncio.Task:
        return asyncio.create_task(self.app(self.scope, self.receive, self.send))



# --- a fake DeploymentHandle, for HandleBackend -------------------------------------------------------


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
        self.generate_whole = FakeMethod([])
        self._streaming: FakeHandle | None = None

    def options(self, stream: bool = False) -> FakeHandle:
        # Like Serve: a distinct handle whose calls stream; generate must be called through it.
        if self._streaming is None:
            self._streaming = FakeHandle(stream=stream)
        return self._streaming
