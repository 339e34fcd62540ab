"""Worker chunks -> OpenAI chat completion JSON: the choice's `message` (or a stream's `delta`) and its
`logprobs.content[]` entries (token, logprob, bytes, top_logprobs), with vLLM's extensions (docs/vllm.md): the
answer's `prompt_logprobs` and `prompt_token_ids`, the choice's `token_ids`, tokens as `token_id:<id>`.

A chunk is already a delta (protocol/carriers.py), so one chunk is one streamed delta and a merged chunk the whole
message. Token strings are each id decoded alone (as for /v1/completions); `bytes` are their UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.finish import openai_finish
from ingress.openai.render.common import generated_ids, generated_tops, token_name
from ingress.openai.render.prompt_logprobs import prompt_logprobs_flat, prompt_logprobs_ids, prompt_logprobs_json
from ingress.openai.validation import VllmFields
from protocol import RequestOutput, compact


@dataclass
class ChatChoice:
    """The one choice of a chat completion; `logprobs` None: none asked for, k: k alternatives each."""

    prompt_ids: list[int]
    logprobs: int | None
    vllm: VllmFields | None = None
    echo: str = ""  # the text the content starts with (chat `echo`): in the message, or the first delta
    started: bool = False
    completion_tokens: int = 0

    def needed_ids(self, chunk: RequestOutput) -> set[int]:
        """Ids whose token text `render(chunk, ...)` or `answer_fields` will look up."""
        ids: set[int] = set()
        if self.vllm is not None and self.vllm.prompt_logprobs is not None and not self.started:
            ids |= prompt_logprobs_ids(chunk, self.vllm.prompt_logprobs)
        if self.logprobs is not None and not (self.vllm is not None and (self.vllm.as_ids or self.vllm.flat_b64)):
            ids |= generated_ids(chunk)
        return ids

    def answer_fields(self, chunk: RequestOutput, texts: Mapping[int, str]) -> dict[str, Any]:
        """vLLM's fields of the answer itself (not of its choice), for the first chunk: `prompt_logprobs` (a whole
        answer only) and `prompt_token_ids`. Call before `render`."""
        out: dict[str, Any] = {}
        if self.vllm is None or self.started:
            return out
        if self.vllm.prompt_logprobs is not None:
            k = self.vllm.prompt_logprobs
            out["prompt_logprobs"] = (prompt_logprobs_flat(chunk, k) if self.vllm.flat_b64
                                      else prompt_logprobs_json(chunk, k, texts))
        if self.vllm.token_ids:
            out["prompt_token_ids"] = list(self.prompt_ids)
        return out

    def render(self, chunk: RequestOutput, texts: Mapping[int, str], stream: bool) -> dict[str, Any]:
        """The choice for `chunk`: the whole `message` of a merged chunk, or a stream's `delta` (the first one
        also names the role)."""
        first = not self.started
        self.started = True
        self.completion_tokens = chunk.completion_tokens
        as_ids = self.vllm is not None and self.vllm.as_ids
        logprobs = None
        if self.logprobs is not None and self.vllm is not None and self.vllm.flat_b64:
            # The compact encoding: the generated tokens' values and ids [n], the k most likely [n, k].
            k = self.logprobs
            rows = chunk.output_token_logprobs or []
            by_ids = self.vllm.logprob_token_ids is not None
            tops = generated_tops(chunk, k, by_ids) if k or by_ids else [[] for _ in rows]
            logprobs = {**compact.encode_token_rows("token_logprobs", rows),
                        **compact.encode_top_rows("top_logprobs", tops)}
        elif self.logprobs is not None:
            k = self.logprobs  # the worker's rows may be wider (prompt_logprobs asked more): keep this field's k

            def entry(value: float, token_id: int) -> dict[str, Any]:
                token = token_name(token_id, texts, as_ids)
                return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

            tops = generated_tops(chunk, k, self.vllm is not None and self.vllm.logprob_token_ids is not None)
            content = [{**entry(v, t), "top_logprobs": [entry(tv, tt) for tv, tt in (tops[j] if j < len(tops)
                                                                                    else ())]}
                       for j, (v, t) in enumerate(chunk.output_token_logprobs or ())]
            logprobs = {"content": content}
        text = (self.echo if first else "") + chunk.text
        if stream:
            key, message = "delta", ({"role": "assistant", "content": text} if first else {"content": text})
        else:
            key, message = "message", {"role": "assistant", "content": text}
        out = {"index": 0, key: message, "logprobs": logprobs, "finish_reason": openai_finish(chunk)}
        if self.vllm is not None and self.vllm.token_ids:
            out["token_ids"] = list(chunk.new_token_ids)
        return out
