"""An asyncio-friendly streaming front of the engine for the worker: the engine loop runs in a background
thread; callers add a request and iterate its deltas; abandoning the iterator aborts the request."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, RequestError
from engine.outputs import FinishReason, RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None) -> None:
        self.engine = engine if engine is not None else LLMEngine(config or EngineConfig())
        # Commands for the engine thread: ("add", rid, ids, params) or ("abort", rid). Only that thread
        # touches the engine, so the scheduler needs no locks.
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="rayscore-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Yields the request's deltas; the last has finished=True. Closing or cancelling the iterator early
        aborts the request and frees its KV blocks."""
        if not self.is_alive:
            raise RuntimeError(f"engine loop is not running: {self.error!r}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already running")
            self._streams[request_id] = stream
        self._commands.put(("add", request_id, prompt_token_ids, params))
        self._wake.set()
        finished = False
        try:
            while not finished:
                out = await stream.queue.get()
                finished = out.finished
                yield out
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- engine thread --------------------------------------------------------------------------
    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, ids, params = cmd
                try:
                    self.engine.add_request(rid, ids, params)
                except RequestError as e:
                    self._deliver(RequestOutput(rid, finished=True, prompt_tokens=len(ids),
                                                finish_reason=FinishReason("error", message=str(e), code=400)))
            else:
                self.engine.abort_request(cmd[1])  # its stream is gone already: nothing to deliver

    def _loop(self) -> None:
        try:
            while not self._stopped:
                self._run_commands()
                if not self.engine.has_unfinished():
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out)
        except BaseException as e:  # the loop must not die silently: fail every waiting request
            log.error("engine loop died: %s", traceback.format_exc())
            self.error = e
            with self._lock:
                rids = list(self._streams)
            for rid in rids:
                self._deliver(RequestOutput(rid, finished=True, finish_reason=FinishReason(
                    "error", message=f"engine failure: {type(e).__name__}: {e}", code=500)))
