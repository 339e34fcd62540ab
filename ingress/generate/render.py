"""/generate's payloads: a RequestOutput -> the contract's JSON answer or event, and its error body.

A chunk is already a delta (protocol/carriers.py), so one chunk is one event and a merged chunk is the whole
answer: the same function renders both. None ("not requested") and [] ("requested, empty") pass
through untouched.
"""

from __future__ import annotations

from typing import Any

from ingress.errors import IngressError
from ingress.finish import seed_finish
from ingress.sse import sse_data
from protocol import RequestOutput, compact

# meta_info's logprob fields: one entry per position, and a list of entries per position.
TOKEN_ROWS = ("input_token_logprobs", "output_token_logprobs")
TOP_ROWS = ("input_top_logprobs", "output_top_logprobs", "input_token_ids_logprobs")


def flat_meta(meta: dict[str, Any]) -> None:
    """return_flat_logprobs_b64: each logprob field of meta_info becomes its flat base64 arrays (protocol/compact.py,
    SGLang's names); a field the answer does not carry stays absent, one that is null stays null."""
    for name in TOKEN_ROWS + TOP_ROWS:
        if name in meta:
            rows = meta.pop(name)
            meta.update(compact.encode_token_rows(name, rows) if name in TOKEN_ROWS
                        else compact.encode_top_rows(name, rows))


def chunk_json(chunk: RequestOutput, flat: bool = False) -> dict[str, Any]:
    """The contract's answer for one chunk (streamed event) or one merged chunk (whole answer); flat: the logprobs
    in the compact encoding."""
    answer = {
        "text": chunk.text,
        "output_ids": chunk.new_token_ids,
        "meta_info": {
            "id": chunk.request_id,
            "finish_reason": seed_finish(chunk),
            "prompt_tokens": chunk.prompt_tokens,
            "completion_tokens": chunk.completion_tokens,
            "cached_tokens": chunk.cached_tokens,
            "input_token_logprobs": chunk.input_token_logprobs,
            "input_top_logprobs": chunk.input_top_logprobs,
            "output_token_logprobs": chunk.output_token_logprobs,
            "output_top_logprobs": chunk.output_top_logprobs,
            "weight_version": chunk.weight_version,
        },
    }
    # The RL fields appear only when the request asked for them, so the contract's answer is unchanged otherwise.
    meta = answer["meta_info"]
    if chunk.input_token_ids_logprobs is not None:
        meta["input_token_ids_logprobs"] = chunk.input_token_ids_logprobs
    if chunk.input_logprob_temperature is not None:
        meta["input_logprob_temperature"] = chunk.input_logprob_temperature
    if flat:
        flat_meta(meta)
    return answer


def sse_event(chunk: RequestOutput, flat: bool = False) -> str:
    return sse_data(chunk_json(chunk, flat))


def error_json(exc: IngressError) -> dict[str, Any]:
    """The contract's error body; `param` is always null on this route."""
    return {"object": "error", "message": exc.message, "type": exc.type, "code": exc.status, "param": None}
