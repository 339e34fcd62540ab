"""What the engine hands back for a request: deltas, where None = not requested and [] = requested, empty."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishType = Literal["stop", "length", "abort", "error"]

# [value, token_id]
TokenLogprob = tuple[float, int]


@dataclass
class FinishReason:
    type: FinishType
    # The stop string or stop token id that ended generation, when there is one.
    matched: str | int | None = None
    message: str | None = None
    # With type "error": 400 when the request itself was bad (the caller's fault), 500 when the engine failed.
    code: int | None = None


@dataclass
class RequestOutput:
    """One delta of a request's stream. Only what is new since the previous delta.

    Logprob lists are None when the request did not ask for them and a (possibly empty) list when it did.
    The last delta has finished=True; nothing follows it.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # running total
    cached_tokens: int = 0
    input_token_logprobs: list[TokenLogprob] | None = None
    input_top_logprobs: list[list[TokenLogprob]] | None = None
    output_token_logprobs: list[TokenLogprob] | None = None
    output_top_logprobs: list[list[TokenLogprob]] | None = None
    # Timings (time.monotonic seconds): arrival, first scheduled, finished.
    arrival_time: float | None = None
    scheduled_time: float | None = None
    finished_time: float | None = None


def _extend(acc: list | None, new: list | None) -> list | None:
    if new is None:
        return acc
    return (acc or []) + new


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """Concatenate a stream's deltas into the whole answer (what a non-streaming caller gets)."""
    if not outputs:
        raise ValueError("no outputs to merge")
    total = RequestOutput(request_id=outputs[0].request_id)
    for o in outputs:
        total.new_token_ids += o.new_token_ids
        total.new_text += o.new_text
        total.input_token_logprobs = _extend(total.input_token_logprobs, o.input_token_logprobs)
        total.input_top_logprobs = _extend(total.input_top_logprobs, o.input_top_logprobs)
        total.output_token_logprobs = _extend(total.output_token_logprobs, o.output_token_logprobs)
        total.output_top_logprobs = _extend(total.output_top_logprobs, o.output_top_logprobs)
        total.finished, total.finish_reason = o.finished, o.finish_reason
        total.prompt_tokens, total.completion_tokens = o.prompt_tokens, o.completion_tokens
        total.cached_tokens = o.cached_tokens
        total.arrival_time = o.arrival_time or total.arrival_time
        total.scheduled_time = o.scheduled_time or total.scheduled_time
        total.finished_time = o.finished_time or total.finished_time
    return total
