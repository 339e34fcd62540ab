"""Worker chunks -> OpenAI legacy completion choices: text, the `logprobs` object (tokens, token_logprobs,
top_logprobs, text_offset), and vLLM's extensions as vLLM writes them (docs/vllm.md): `prompt_logprobs`,
`prompt_token_ids` and `token_ids` (return_token_ids), tokens as `token_id:<id>` (return_tokens_as_token_ids)."""

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
class ChoiceBuilder:
    """One prompt's choice. The first delta carries the echoed prompt (text, tokens and logprobs: the
    prompt rows arrive once, in the first chunk); later deltas carry only generated tokens."""

    index: int
    prompt_ids: list[int]
    prompt_text: str  # what `echo` returns: the prompt as sent, or its ids decoded
    echo: bool
    logprobs: int | None  # None: no `logprobs` object; k: k alternatives per position
    vllm: VllmFields | None = None
    text_offset: int = 0  # where the next token starts in this choice's text
    started: bool = False
    completion_tokens: int = 0

    @property
    def _as_ids(self) -> bool:
        return self.vllm is not None and self.vllm.as_ids

    @property
    def _by_ids(self) -> bool:
        return self.vllm is not None and self.vllm.logprob_token_ids is not None

    @property
    def _flat(self) -> bool:
        return self.vllm is not None and self.vllm.flat_b64

    def needed_ids(self, chunk: RequestOutput) -> set[int]:
        """Ids whose token text `delta(chunk, ...)` will look up."""
        ids: set[int] = set()
        if self.vllm is not None and self.vllm.prompt_logprobs is not None and not self.started:
            ids |= prompt_logprobs_ids(chunk, self.vllm.prompt_logprobs)
        if self.logprobs is None or self._as_ids or self._flat:
            return ids
        if self.echo and not self.started:
            ids.update(self.prompt_ids)
            for row in chunk.input_top_logprobs or ():
                ids.update(t for _, t in row[:self.logprobs])
        return ids | generated_ids(chunk)

    def delta(self, chunk: RequestOutput, texts: Mapping[int, str]) -> dict[str, Any]:
        """The choice's JSON for `chunk`: a streamed delta, or the whole choice for a merged chunk."""
        first = not self.started
        echo_now = self.echo and first
        self.started = True
        self.completion_tokens = chunk.completion_tokens
        logprobs = None
        if self.logprobs is not None and self._flat:
            logprobs = self._flat_logprobs(chunk, echo_now)
        elif self.logprobs is not None:
            tokens: list[str] = []
            values: list[float | None] = []
            tops: list[dict[str, float] | None] = []
            if echo_now:
                # Nothing predicts the first prompt token: OpenAI's null; rows score ids[1:], in order.
                tokens += [token_name(t, texts, self._as_ids) for t in self.prompt_ids]
                values.append(None)
                tops.append(None)
                self._rows(chunk.input_token_logprobs, chunk.input_top_logprobs, texts, values, tops,
                           self.logprobs or 0)
            generated = chunk.output_token_logprobs or []
            tokens += [token_name(t, texts, self._as_ids) for _, t in generated]
            self._rows(generated, generated_tops(chunk, self.logprobs or 0, self._by_ids), texts, values, tops,
                       None if self._by_ids else self.logprobs or 0)
            offsets = []
            for token in tokens:
                offsets.append(self.text_offset)
                self.text_offset += len(token)
            logprobs = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
        out = {
            "index": self.index,
            "text": (self.prompt_text if echo_now else "") + chunk.text,
            "logprobs": logprobs,
            "finish_reason": openai_finish(chunk),
        }
        if self.vllm is not None:
            if self.vllm.prompt_logprobs is not None and first:
                k = self.vllm.prompt_logprobs
                out["prompt_logprobs"] = (prompt_logprobs_flat(chunk, k) if self._flat
                                          else prompt_logprobs_json(chunk, k, texts))
            if self.vllm.token_ids:  # vLLM: the prompt's ids in a choice's first delta, the new ids in each
                if first:
                    out["prompt_token_ids"] = list(self.prompt_ids)
                out["token_ids"] = list(chunk.new_token_ids)
        return out

    def _flat_logprobs(self, chunk: RequestOutput, echo_now: bool) -> dict[str, Any]:
        """The `logprobs` object in the compact encoding: each position's value and token id [n] (null_prefix 1 for the
        echoed first prompt token), and the k most likely [n, k]; the tokens are their ids, so no text is looked up."""
        k = self.logprobs or 0
        rows = (list(chunk.input_token_logprobs or []) if echo_now else []) + list(chunk.output_token_logprobs or [])
        tops = ([r[:k] for r in chunk.input_top_logprobs or []] if echo_now else []) + generated_tops(
            chunk, k, self._by_ids)
        if k == 0 and not self._by_ids:
            tops = [[] for _ in rows]
        prefix = 1 if echo_now else 0
        return {**compact.encode_token_rows("token_logprobs", rows, null_prefix=prefix),
                **compact.encode_top_rows("top_logprobs", tops, null_prefix=prefix)}

    def _rows(self, rows: list[list] | None, top_rows: list[list[list]] | None, texts: Mapping[int, str],
              values: list[float | None], tops: list[dict[str, float] | None], k: int | None) -> None:
        """k: the alternatives kept per row (the worker's rows may be wider: prompt_logprobs asked more), or None:
        all of them (logprob_token_ids' rows, the token itself first)."""
        for j, (value, token_id) in enumerate(rows or ()):
            values.append(value)
            # The k most likely (k = `logprobs`), best first, then the actual token when it is not among
            # them: OpenAI's "up to logprobs + 1" entries. A text two ids share keeps the higher value.
            top: dict[str, float] = {}
            for v, t in (top_rows[j][:k] if j < len(top_rows) else ()) if top_rows else ():
                top.setdefault(token_name(t, texts, self._as_ids), v)
            top.setdefault(token_name(token_id, texts, self._as_ids), value)
            tops.append(top)
