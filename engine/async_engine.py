"""An asyncio-friendly streaming front of the engine for the worker: the engine loop runs in a background
thread; callers add a request and iterate its deltas; abandoning the iterator aborts the request.

Self-protection lives here too: a bounded queue of requests not yet started (admission.py; one more is refused
at once with a 503-coded error), outputs turned into the caller's carriers in the engine thread (so a large
delta never holds the caller's event loop), and a health check that tells a stuck engine from a busy one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from engine.commands import AbortRequest, AddRequest, Command, Control, RunBetweenSteps, RunExclusive
from engine.config import EngineConfig
from engine.core.admission import OVERLOADED, AdmissionQueue
from engine.core.pause import PauseState
from engine.llm_engine import LLMEngine, RequestError
from engine.multimodal.image_input import ImageInput
from engine.stats import ServingStats
from protocol.control import FlushCache, GenerationControl, Pause, Resume
from protocol.outputs import FinishReason, RequestOutput
from protocol.sampling import SamplingParams
from rulebook import rules

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    convert: Callable[[RequestOutput], Any]


class EngineUnhealthy(RuntimeError):
    """The engine loop died, or has work and made no progress for stuck_engine_timeout_s."""


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None,
                 convert: Callable[[RequestOutput], Any] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        """`convert` turns each output into what `generate` yields (the worker's carrier); it runs in the engine
        thread, so the caller's event loop only hands the result on. It must keep `.finished`. `on_fatal`: called
        with the error when the loop dies, before its waiting requests are failed (a split worker ends its process
        there: its ranks' group is broken, and the ingress runs again a request whose worker died unanswered)."""
        self.engine = engine if engine is not None else LLMEngine(config or EngineConfig())
        cfg = self.engine.config
        self._convert: Callable[[RequestOutput], Any] = convert or (lambda out: out)
        self.admission = AdmissionQueue(cfg.max_queued_requests, cfg.max_queued_tokens)
        # When the engine thread last finished a loop turn (a step, or an idle wait): the stuck-engine clock.
        self._last_progress = time.monotonic()
        # Commands for the engine thread (engine/commands.py). Only that thread touches the engine, so the
        # scheduler needs no locks.
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        # An exclusive call waiting for the engine to drain (run_exclusive) and the adds held back meanwhile.
        self._exclusive: tuple[Callable[[LLMEngine], Any], concurrent.futures.Future, int] | None = None
        self._held: list[Command] = []
        self._pause = PauseState(cfg.pause_timeout_s)  # only the engine thread writes it (paused_mode reads)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self.error: BaseException | None = None
        self._on_fatal = on_fatal
        self._thread = threading.Thread(target=self._loop, name="rayscore-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       convert: Callable[[RequestOutput], Any] | None = None, group: str | None = None,
                       shared_tokens: int = 0, images: list[ImageInput] | None = None) -> AsyncIterator[Any]:
        """Yields the request's deltas, each through `convert` (default: the engine's) in the engine thread; the
        last has finished=True. Closing or cancelling the iterator early aborts the request and frees its KV
        blocks. Over the queue bounds, the one delta is a 503-coded error and nothing is queued. `group` and
        `shared_tokens`: admitted with the other requests of its group (admission.py). `images`: as
        LLMEngine.add_request takes them."""
        convert = convert or self._convert
        if not self.is_alive:
            raise RuntimeError(f"engine loop is not running: {self.error!r}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), convert)
        # The id is checked before admission, under the lock that registers it: a reused id is refused (400)
        # without touching the admission count of the request that holds it.
        with self._lock:
            in_use = request_id in self._streams
            refusal = None if in_use else self.admission.admit(request_id, len(prompt_token_ids), group,
                                                                   shared_tokens)
            if not in_use and refusal is None:
                self._streams[request_id] = stream
        if in_use or refusal is not None:
            error = (FinishReason("error", message=rules.REQUEST_ID_IN_USE.format(rid=request_id), code=400)
                     if in_use else FinishReason("error", message=refusal, code=OVERLOADED))
            yield convert(RequestOutput(request_id, finished=True, prompt_tokens=len(prompt_token_ids),
                                        finish_reason=error))
            return
        self._commands.put(AddRequest(request_id, prompt_token_ids, params, images))
        self._wake.set()
        finished = False
        try:
            while not finished:
                out = await stream.queue.get()
                finished = out.finished
                yield out
        finally:
            self.admission.release(request_id)
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))
        self._wake.set()

    def run_exclusive(self, fn: Callable[[LLMEngine], Any], abort_all: bool = False) -> concurrent.futures.Future:
        """Run fn(engine) in the engine thread once no request is in the engine: the requests in it finish first
        (or are aborted, abort_all), and requests that arrive meanwhile wait and start after fn. The future's
        result is (fn's result, how many requests were in the engine when the call arrived). What a weight update
        needs: no answer spans two weights."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(RunExclusive(fn, abort_all, done))
        self._wake.set()
        return done

    def run_between_steps(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run fn(engine) in the engine thread between two steps (a cache flush); the future holds its result."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(RunBetweenSteps(fn, done))
        self._wake.set()
        return done

    def reconfigure(self, config: EngineConfig) -> concurrent.futures.Future:
        """Apply `config` (EngineConfig.with_runtime of this engine's) between two steps: the step budget, the
        queue bounds, the limits and the timeouts; a queued request keeps its place. The future resolves once it
        holds."""
        def apply(engine: LLMEngine) -> None:
            engine.apply_runtime(config)
            self.admission.resize(config.max_queued_requests, config.max_queued_tokens)
            self._pause.timeout_s = config.pause_timeout_s  # only the engine thread touches the pause

        return self.run_between_steps(apply)

    def control(self, op: GenerationControl) -> concurrent.futures.Future:
        """Run a control operation between two steps: Pause (in SGLang's mode, engine/core/pause.py), Resume (with
        empty_cache, first hand the CUDA allocator's cached blocks back to the driver, so no kernel runs on them),
        Abort (a live request, or every one, ending with finish_reason abort and what it produced so far),
        FlushCache. The future holds how many requests it touched."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(Control(op, done))
        self._wake.set()
        return done

    @property
    def paused_mode(self) -> str | None:
        """The pause's mode, None while generating. Read from other threads for reports only: a reading a moment
        old is as good as a fresh one (one attribute, written by the engine thread)."""
        return self._pause.mode

    def stats(self) -> ServingStats:
        queued, queued_tokens = self.admission.queued
        engine = asdict(self.engine.stats())
        return ServingStats(**{**engine, "queued_tokens": queued_tokens}, queued=queued,
                            refused=self.admission.num_refused)

    def stalled_for(self) -> float:
        """Seconds the engine thread has had work and finished no loop turn (0 when idle or moving)."""
        with self._lock:
            pending = bool(self._streams)
        if not pending and not self.engine.has_unfinished():
            return 0.0
        return max(0.0, time.monotonic() - self._last_progress)

    def check_health(self) -> None:
        """Raises EngineUnhealthy when the loop died or is stuck: work pending and no step finished for
        stuck_engine_timeout_s. A long step is busy, not stuck, as long as it ends within that time."""
        if not self.is_alive:
            raise EngineUnhealthy(f"engine loop died: {self.error!r}")
        limit = self.engine.config.stuck_engine_timeout_s
        stalled = self.stalled_for()
        if stalled > limit:
            raise EngineUnhealthy(f"engine stuck: work pending and no step finished for {stalled:.0f} s "
                                  f"(stuck_engine_timeout_s={limit:g})")

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- engine thread --------------------------------------------------------------------------
    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, stream.convert(out))

    def _started(self, request_id: str) -> bool:
        seq = self.engine.seqs.get(request_id)
        return seq is not None and seq.scheduled_time is not None

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            self._dispatch(cmd)

    def _dispatch(self, cmd: Command) -> None:
        draining = isinstance(cmd, Control) and isinstance(cmd.op, Pause) and cmd.op.drain
        if isinstance(cmd, RunBetweenSteps | Control):  # between two steps: none in flight (pipeline overlap)
            for out in self.engine.drain():
                self._deliver(out)
        if (isinstance(cmd, AddRequest | RunExclusive) or draining) and self._exclusive is not None:
            self._held.append(cmd)  # starts after the exclusive call, on what it leaves (new weights)
        elif isinstance(cmd, AddRequest):
            self._add(cmd)
        elif isinstance(cmd, RunExclusive):
            paused = len(self.engine.seqs)
            if cmd.abort_all:
                for rid in list(self.engine.seqs):
                    out = self.engine.abort_request(rid)
                    if out is not None:
                        self._deliver(out)
            self._exclusive = (cmd.fn, cmd.done, paused)
        elif isinstance(cmd, RunBetweenSteps):
            _run_into(cmd.done, cmd.fn, self.engine)
        elif draining and not self._pause.active:  # already paused: nothing in flight will move to drain
            assert isinstance(cmd, Control) and isinstance(cmd.op, Pause)
            self._drain_then_pause(cmd.op, cmd.done)
        elif isinstance(cmd, Control):
            _run_into(cmd.done, lambda eng: self._control(cmd.op), self.engine)
        else:
            self.engine.abort_request(cmd.request_id)  # its stream is gone already: nothing to deliver

    def _drain_then_pause(self, op: Pause, done: concurrent.futures.Future) -> None:
        """A draining pause is an exclusive call: new requests are held (then wait in the paused engine), those in
        flight finish, and the pause starts once the engine has drained; `done` holds how many were in flight."""
        inner: concurrent.futures.Future = concurrent.futures.Future()

        def settle(f: concurrent.futures.Future) -> None:
            exc = f.exception()
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(f.result()[1])

        inner.add_done_callback(settle)
        self._exclusive = (lambda eng: self._pause.start(eng, op.mode), inner, len(self.engine.seqs))

    def _control(self, op: GenerationControl) -> int:
        if isinstance(op, FlushCache):
            self.engine.flush_cache()
            return 0
        if isinstance(op, Resume):
            if op.empty_cache:
                self.engine.release_cached_memory()
            self._pause.end()
            return 0
        if isinstance(op, Pause):
            count, outs = self._pause.start(self.engine, op.mode)
        else:  # Abort
            rids = [op.request_id] if op.request_id is not None else list(self.engine.seqs)
            outs = [out for rid in rids if (out := self.engine.abort_request(rid)) is not None]
            count = len(outs)
        for out in outs:
            self._deliver(out)
        return count

    def _add(self, cmd: AddRequest) -> None:
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params, cmd.images)
        except RequestError as e:
            self._deliver(RequestOutput(cmd.request_id, finished=True, prompt_tokens=len(cmd.prompt_token_ids),
                                        finish_reason=FinishReason("error", message=str(e), code=400)))

    def _run_exclusive_when_drained(self) -> None:
        drained = not self.engine.has_unfinished() or (self._pause.active and self._pause.holds_no_kv(self.engine))
        if self._exclusive is None or not drained:
            return
        fn, done, paused = self._exclusive
        self._exclusive = None
        _run_into(done, lambda eng: (fn(eng), paused), self.engine)
        held, self._held = self._held, []
        for cmd in held:
            # A held request whose client left is not started.
            if not isinstance(cmd, AddRequest) or cmd.request_id in self._streams:
                self._dispatch(cmd)

    def _loop(self) -> None:
        _name_os_thread(self._thread.name)
        try:
            while not self._stopped:
                self._last_progress = time.monotonic()
                self._run_commands()
                self._run_exclusive_when_drained()
                if self._pause.active:  # no step; waiting requests time out (engine/core/pause.py)
                    for out in self._pause.expired(self.engine):
                        self._deliver(out)
                if self._pause.active or not self.engine.has_unfinished():
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out)
                self.admission.release_started(self._started)
        except BaseException as e:  # the loop must not die silently: fail every waiting request
            log.error("engine loop died: %s", traceback.format_exc())
            self.error = e
            if self._on_fatal is not None:
                self._on_fatal(e)
            with self._lock:
                rids = list(self._streams)
            for rid in rids:
                self._deliver(RequestOutput(rid, finished=True, finish_reason=FinishReason(
                    "error", message=f"engine failure: {type(e).__name__}: {e}", code=500)))


def _run_into(done: concurrent.futures.Future, fn: Callable[[LLMEngine], Any], engine: LLMEngine) -> None:
    """fn(engine)'s result or exception into `done`: a failing call fails its caller, never the engine loop."""
    try:
        done.set_result(fn(engine))
    except Exception as exc:  # noqa: BLE001  # handed to the caller, who reports it
        done.set_exception(exc)


def _name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS too (Linux: /proc/<pid>/task/<tid>/comm, 15 bytes), so profilers
    and `python -m bench` tell the engine thread, and torch's compute threads it starts, from the event loop's.
    Best effort: elsewhere, or without libc, nothing happens."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
