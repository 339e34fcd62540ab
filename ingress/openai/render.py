"""Worker chunks -> OpenAI completion JSON: choices, their `logprobs` object, usage; and OpenAI's error body.

A chunk is already a delta (protocol.py), so one chunk is one streamed choice delta and a merged chunk is
the whole choice: `ChoiceBuilder.delta` renders both. Token strings are each id decoded alone (as OpenAI
and vLLM do); the caller fetches them from the worker's tokenizer for the ids `needed_ids` names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ingress.errors import IngressError
from workers.protocol import FinishReason, GenerateChunk


@dataclass
class ChoiceBuilder:
    """One prompt's choice. The first delta carries the echoed prompt (text, tokens and logprobs: the
    prompt rows arrive once, in the first chunk); later deltas carry only generated tokens."""

    index: int
    prompt_ids: list[int]
    prompt_text: str  # what `echo` returns: the prompt as sent, or its ids decoded
    echo: bool
    logprobs: int | None  # None: no `logprobs` object; k: k alternatives per position
    text_offset: int = 0  # where the next token starts in this choice's text
    started: bool = False
    completion_tokens: int = 0

    def needed_ids(self, chunk: GenerateChunk) -> set[int]:
        """Ids whose token text `delta(chunk, ...)` will look up."""
        if self.logprobs is None:
            return set()
        ids: set[int] = set()
        if self.echo and not self.started:
            ids.update(self.prompt_ids)
            for row in chunk.input_top_logprobs or ():
                ids.update(t for _, t in row)
        return ids | generated_ids(chunk)

    def delta(self, chunk: GenerateChunk, texts: Mapping[int, str]) -> dict[str, Any]:
        """The choice's JSON for `chunk`: a streamed delta, or the whole choice for a merged chunk."""
        echo_now = self.echo and not self.started
        self.started = True
        self.completion_tokens = chunk.completion_tokens
        logprobs = None
        if self.logprobs is not None:
            tokens: list[str] = []
            values: list[float | None] = []
            tops: list[dict[str, float] | None] = []
            if echo_now:
                # Nothing predicts the first prompt token: OpenAI's null; rows score ids[1:], in order.
                tokens += [texts[t] for t in self.prompt_ids]
                values.append(None)
                tops.append(None)
                self._rows(chunk.input_token_logprobs, chunk.input_top_logprobs, texts, values, tops)
            generated = chunk.output_token_logprobs or []
            tokens += [texts[t] for _, t in generated]
            self._rows(generated, chunk.output_top_logprobs, texts, values, tops)
            offsets = []
            for token in tokens:
                offsets.append(self.text_offset)
                self.text_offset += len(token)
            logprobs = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
        return {
            "index": self.index,
            "text": (self.prompt_text if echo_now else "") + chunk.text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(chunk),
        }

    def _rows(self, rows: list[list] | None, top_rows: list[list[list]] | None, texts: Mapping[int, str],
              values: list[float | None], tops: list[dict[str, float] | None]) -> None:
        for j, (value, token_id) in enumerate(rows or ()):
            values.append(value)
            # The k most likely (k = `logprobs`), best first, then the actual token when it is not among
            # them: OpenAI's "up to logprobs + 1" entries. A text two ids share keeps the higher value.
            top: dict[str, float] = {}
            for v, t in top_rows[j] if top_rows else ():
                top.setdefault(texts[t], v)
            top.setdefault(texts[token_id], value)
            tops.append(top)


def generated_ids(chunk: GenerateChunk) -> set[int]:
    """The ids a chunk's generated-token logprobs name: each token's and its alternatives'."""
    ids = {t for _, t in chunk.output_token_logprobs or ()}
    for row in chunk.output_top_logprobs or ():
        ids.update(t for _, t in row)
    return ids


def finish_reason(chunk: GenerateChunk) -> str | None:
    if not chunk.finished or chunk.finish_reason is None:
        return None
    return chunk.finish_reason.type


def echo_only_chunk(rid: str, prompt_len: int) -> GenerateChunk:
    """The whole answer of a prompt with nothing to compute (max_tokens 0 and no prompt rows asked for)."""
    return GenerateChunk(rid=rid, finished=True, finish_reason=FinishReason(type="length"),
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
