"""Paused generation (SGLang's /pause_generation and /continue_generation), owned by the engine thread.

While paused the engine takes no step; requests keep arriving and wait in the scheduler's queue, each for at most
`pause_timeout_s` (then it ends with a 503-coded error naming the field, so a client is never held forever). What
happens to the requests in flight is the mode's, as SGLang defines them:
- abort: every request in the engine ends now with finish_reason abort and what it produced so far (an RL client
  resubmits the rest after the weight update);
- retract: running requests give back their KV cache and wait, keeping their rows and tokens; they recompute after
  `continue` (on the weights then served);
- in_place: requests keep their KV cache and resume where they were.
A weight update (run_exclusive) may run while paused once no request holds KV blocks (after abort or retract).
"""

from __future__ import annotations

import time

from engine.core.admission import OVERLOADED
from engine.llm_engine import LLMEngine
from protocol.control import PauseMode
from protocol.outputs import FinishReason, RequestOutput
from rulebook.sglang import PAUSE_MODES

PAUSED_TOO_LONG = ("Generation has been paused for more than {seconds:g} s (config field `pause_timeout_s`); the "
                   "request was not started. Retry after POST /continue_generation.")


class PauseState:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.mode: PauseMode | None = None
        self.since = 0.0

    @property
    def active(self) -> bool:
        return self.mode is not None

    def start(self, engine: LLMEngine, mode: PauseMode) -> tuple[int, list[RequestOutput]]:
        """Pause in `mode`: how many requests were in the engine, and the outputs to deliver now: of the steps that
        were in flight, then the final ones of those aborted."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {mode!r}")
        count = len(engine.seqs)
        outs: list[RequestOutput] = engine.drain()  # the steps in flight (pipeline overlap) finish first
        if mode == "abort":
            outs += [out for rid in list(engine.seqs) if (out := engine.abort_request(rid)) is not None]
        elif mode == "retract":
            engine.scheduler.retract_all()
        if not self.active:
            self.since = time.monotonic()
        self.mode = mode
        return count, outs

    def end(self) -> None:
        self.mode = None

    def holds_no_kv(self, engine: LLMEngine) -> bool:
        """No request holds KV blocks (waiting requests never do): the weights may change under them."""
        return not engine.scheduler.running

    def expired(self, engine: LLMEngine) -> list[RequestOutput]:
        """Waiting requests that have waited out the pause's timeout: ended with a 503-coded error."""
        now = time.monotonic()
        outs = []
        for seq in list(engine.scheduler.waiting):
            if now - max(seq.arrival_time, self.since) <= self.timeout_s:
                continue
            out = engine.abort_request(seq.request_id)
            if out is not None:
                out.finish_reason = FinishReason("error", message=PAUSED_TOO_LONG.format(seconds=self.timeout_s),
                                                 code=OVERLOADED)
                outs.append(out)
        return outs
