"""GenerateChunk -> the contract's JSON answer, and the server-sent-event framing of a stream.

A chunk is already a delta (protocol.py), so one chunk is one event and a merged chunk is the whole
answer: the same function renders both. None ("not requested") and [] ("requested, empty") pass
through untouched.
"""

from __future__ import annotations

import json

from workers.protocol import FinishInfo, GenerateChunk

SSE_DONE = "data: [DONE]\n\n"
# Proxies (nginx) buffer responses unless told otherwise; an SSE stream must reach the client per event.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def chunk_json(chunk: GenerateChunk) -> dict:
    """The contract's answer for one chunk (streamed event) or one merged chunk (whole answer)."""
    return {
        "text": chunk.text,
        "output_ids": chunk.output_ids,
        "meta_info": {
            "id": chunk.rid,
            "finish_reason": chunk.finish_reason.to_json() if chunk.finish_reason is not None else None,
            "prompt_tokens": chunk.prompt_tokens,
            "completion_tokens": chunk.completion_tokens,
            "cached_tokens": chunk.cached_tokens,
            "input_token_logprobs": chunk.input_token_logprobs,
            "input_top_logprobs": chunk.input_top_logprobs,
            "output_token_logprobs": chunk.output_token_logprobs,
            "output_top_logprobs": chunk.output_top_logprobs,
        },
    }


def sse_event(chunk: GenerateChunk) -> str:
    # allow_nan: a raw logit can be -inf; Python's json writes it as -Infinity rather than failing.
    return f"data: {json.dumps(chunk_json(chunk), ensure_ascii=False, allow_nan=True, separators=(',', ':'))}\n\n"


def error_chunk(last: GenerateChunk, message: str) -> GenerateChunk:
    """The final delta of a stream the worker could not finish: nothing new, finish_reason `error`.

    Counts repeat the last chunk's (they are totals, not deltas). A logprob field the request asked for
    (non-None so far) is [] here, one it did not ask for stays None, so concatenating still works.
    """

    def empty_like(field: list | None) -> list | None:
        return None if field is None else []

    return GenerateChunk(
        rid=last.rid,
        finished=True,
        finish_reason=FinishInfo(type="error", message=message),
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
        input_token_logprobs=empty_like(last.input_token_logprobs),
        input_top_logprobs=empty_like(last.input_top_logprobs),
        output_token_logprobs=empty_like(last.output_token_logprobs),
        output_top_logprobs=empty_like(last.output_top_logprobs),
    )
