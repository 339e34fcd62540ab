"""Worker chunks -> OpenAI legacy completion choices: text, the `logprobs` object (tokens, token_logprobs,
top_logprobs, text_offset), vLLM's token ids."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.openai.render.common import finish_reason, generated_ids
from workers.protocol import GenerateChunk


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
