"""One finish, every dialect's fields: how each route writes the engine's FinishReason (protocol/outputs.py).

The canonical finish is a type (stop, length, abort, error), what ended a stop (a stop string or token id, or the
end-of-text token), a message and, for an error, its code. The dialects name it differently:
- OpenAI (completions, chat) and vLLM's token-in route: `finish_reason` is the type, once finished; vLLM adds
  `stop_reason`, the stop string or one of the request's own stop token ids (null on end-of-text);
- the seed's /generate: `meta_info.finish_reason` is the finish itself, `matched` and `message` only when set (never
  the internal code);
- SGLang's /generate: `length` carries the tokens generated, `stop` what matched, and an abort or a failure (which
  SGLang reports as an abort) its message, a failure also its status code.
A failure before the first byte is an error answer, not a finish (ingress/errors.py's finish_error); these write the
finishes that reach an answer.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from protocol import RequestOutput


def openai_finish(chunk: RequestOutput) -> str | None:
    """OpenAI's (and vLLM's) `finish_reason`: the finish's type on the chunk that finishes, else null."""
    if not chunk.finished or chunk.finish_reason is None:
        return None
    return chunk.finish_reason.type


def vllm_stop_reason(chunk: RequestOutput, stop_token_ids: Collection[int]) -> int | str | None:
    """vLLM's `stop_reason`: the stop string or stop token id (one the request named) that ended generation; null on
    the end-of-text token and on every finish but a stop."""
    finish = chunk.finish_reason
    if finish is None or finish.type != "stop":
        return None
    matched = finish.matched
    return matched if isinstance(matched, str) or matched in stop_token_ids else None


def seed_finish(chunk: RequestOutput) -> dict[str, Any] | None:
    """The seed /generate's `meta_info.finish_reason`: `matched` and `message` only when there is one."""
    finish = chunk.finish_reason
    if finish is None:
        return None
    out: dict[str, Any] = {"type": finish.type}
    if finish.matched is not None:
        out["matched"] = finish.matched
    if finish.message is not None:
        out["message"] = finish.message
    return out


def sglang_finish(chunk: RequestOutput) -> dict[str, Any] | None:
    """SGLang's `meta_info.finish_reason`, on the chunk that finishes: length with the tokens generated, stop with
    what matched, else an abort with its message (a failure: with its status code too)."""
    finish = chunk.finish_reason
    if not chunk.finished or finish is None:
        return None
    if finish.type == "length":
        return {"type": "length", "length": chunk.completion_tokens}
    if finish.type == "stop":
        return {"type": "stop", "matched": finish.matched}
    out: dict[str, Any] = {"type": "abort", "message": finish.message or "Aborted."}
    if finish.type == "error":
        out["status_code"] = finish.code or 500
    return out
