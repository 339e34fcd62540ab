"""Worker chunks -> OpenAI chat completion JSON: the choice's `message` (or a stream's `delta`) and its
`logprobs.content[]` entries (token, logprob, bytes, top_logprobs).

A chunk is already a delta (protocol.py), so one chunk is one streamed delta and a merged chunk the whole
message. Token strings are each id decoded alone (as for /v1/completions); `bytes` are their UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.openai.render.common import finish_reason, generated_ids
from workers.protocol import GenerateChunk


def _entry(value: float, token_id: int, texts: Mapping[int, str]) -> dict[str, Any]:
    token = texts[token_id]
    return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}


@dataclass
class ChatChoice:
    """The one choice of a chat completion; `logprobs` None: none asked for, k: k alternatives each."""

    prompt_ids: list[int]
    logprobs: int | None
    started: bool = False
    completion_tokens: int = 0

    def needed_ids(self, chunk: GenerateChunk) -> set[int]:
        """Ids whose token text `render(chunk, ...)` will look up."""
        return set() if self.logprobs is None else generated_ids(chunk)

    def render(self, chunk: GenerateChunk, texts: Mapping[int, str], stream: bool) -> dict[str, Any]:
        """The choice for `chunk`: the whole `message` of a merged chunk, or a stream's `delta` (the first one
        also names the role)."""
        first = not self.started
        self.started = True
        self.completion_tokens = chunk.completion_tokens
        logprobs = None
        if self.logprobs is not None:
            tops = chunk.output_top_logprobs or []
            content = [{**_entry(v, t, texts),
                        "top_logprobs": [_entry(tv, tt, texts) for tv, tt in (tops[j] if j < len(tops) else ())]}
                       for j, (v, t) in enumerate(chunk.output_token_logprobs or ())]
            logprobs = {"content": content}
        if stream:
            key, message = "delta", ({"role": "assistant", "content": chunk.text} if first else {"content": chunk.text})
        else:
            key, message = "message", {"role": "assistant", "content": chunk.text}
        return {"index": 0, key: message, "logprobs": logprobs, "finish_reason": finish_reason(chunk)}
