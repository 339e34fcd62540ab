"""What the OpenAI routes' renderings share: the response envelope, usage, OpenAI's error body.

A chunk is already a delta (protocol/carriers.py), so one chunk is one streamed choice delta and a merged chunk is the
whole choice. Token strings are each id decoded alone (as OpenAI and vLLM do); the caller decodes them with the
ingress's tokenizer (ingress/text.py) for the ids a choice's `needed_ids` names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ingress.errors import IngressError
from protocol import FinishReason, RequestOutput


def generated_ids(chunk: RequestOutput) -> set[int]:
    """The ids a chunk's generated-token logprobs name: each token's and its alternatives'."""
    ids = {t for _, t in chunk.output_token_logprobs or ()}
    for row in [*(chunk.output_top_logprobs or ()), *(chunk.output_token_ids_logprobs or ())]:
        ids.update(t for _, t in row)
    return ids


def token_name(token_id: int, texts: Mapping[int, str], as_ids: bool) -> str:
    """A logprob entry's token: its text decoded alone, or vLLM's `token_id:<id>` (return_tokens_as_token_ids), which
    names a token that no JSON string spells (a lone byte of a multi-byte character)."""
    return f"token_id:{token_id}" if as_ids else texts[token_id]


def generated_tops(chunk: RequestOutput, k: int, by_ids: bool) -> list[list[list]]:
    """Each generated token's alternatives: its k most likely, or (vLLM's logprob_token_ids) the token itself then
    the asked ids, each id once, as vLLM's dict of them holds it."""
    if not by_ids:
        return [r[:k] for r in chunk.output_top_logprobs or ()]
    rows = []
    for (value, token), asked in zip(chunk.output_token_logprobs or (), chunk.output_token_ids_logprobs or (),
                                     strict=False):
        row = {token: [value, token]}
        for v, t in asked:
            row.setdefault(t, [v, t])
        rows.append(list(row.values()))
    return rows


def echo_only_chunk(rid: str, prompt_len: int) -> RequestOutput:
    """The whole answer of a prompt with nothing to compute (max_tokens 0 and no prompt rows asked for)."""
    return RequestOutput(request_id=rid, finished=True, finish_reason=FinishReason(type="length"),
                         prompt_tokens=prompt_len)


class Counted(Protocol):
    """A choice that knows its prompt and how many tokens it generated (ChoiceBuilder, chat's ChatChoice)."""

    prompt_ids: list[int]
    completion_tokens: int


def usage_json(choices: Sequence[Counted]) -> dict[str, int]:
    prompt = sum(len(c.prompt_ids) for c in choices)
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_json(cid: str, created: int, model: str, choices: list[dict[str, Any]],
                    usage: dict[str, int] | None = None, with_usage: bool = True,
                    obj: str = "text_completion") -> dict[str, Any]:
    """The response (or one streamed chunk, with `with_usage` only when the client asked for usage); `obj` is
    the object's kind (chat: "chat.completion", "chat.completion.chunk")."""
    out: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": model, "choices": choices}
    if with_usage:
        out["usage"] = usage
    return out


def error_json(exc: IngressError) -> dict[str, Any]:
    """OpenAI's error body, for an answer and for the in-band error event of a stream."""
    return {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.status}}
