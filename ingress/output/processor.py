"""The one output processor: a worker request's deltas -> the client's, made in the ingress from the ids the worker
streams back. Every path of the worker client applies it once to each delta (a stream, a member of a many-request
call, a unary call's whole answer), as vLLM v1's OutputProcessor runs once per engine output.

Each delta gets its text (detokenizer.py) and stop strings are matched, as vLLM's API server does. When a stop string
matches, the answer ends at the token that completed it, exactly where the engine ended it when it matched stop
strings itself: its ids, logprob rows and completion_tokens stop there, and the finish is `stop` with the string. The
engine may have generated a few more tokens meanwhile (it learns of the stop when the ingress closes the worker call,
which aborts the request); they are dropped here and never reach the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from ingress.output.detokenizer import IncrementalDetokenizer
from protocol import FinishReason, RequestOutput, SamplingParams

Tokenizer = Callable[[], Awaitable[Any]]


def _cut(rows: list | None, n: int) -> list | None:
    return None if rows is None else rows[:n]


class OutputProcessor:
    """One worker request's deltas -> the same deltas with their text, cut at the first stop string. The tokenizer
    is fetched at the first generated ids, so a scoring answer never needs it."""

    def __init__(self, params: SamplingParams, tokenizer: Tokenizer) -> None:
        self._params = params
        self._tokenizer = tokenizer
        self._detok: IncrementalDetokenizer | None = None

    @property
    def stopped(self) -> bool:
        """A stop string ended the answer: the worker's request must be ended too (its call closed)."""
        return self._detok is not None and self._detok.stopped_by is not None

    async def feed(self, chunk: RequestOutput) -> RequestOutput:
        """`chunk` with its text; a chunk in which a stop string completes is the answer's last: the ids and logprob
        rows after the stopping token are dropped and the finish says which string matched."""
        got = chunk.new_token_ids
        if self._detok is None:
            if not got:
                return chunk
            self._detok = IncrementalDetokenizer(await self._tokenizer(), self._params)
        detok = self._detok
        kept = detok.add(got)
        stop = detok.stopped_by
        if stop is None:
            return dataclasses.replace(chunk, text=detok.delta(chunk.finished))
        return dataclasses.replace(
            chunk, text=detok.delta(True), new_token_ids=got[:kept], finished=True,
            finish_reason=FinishReason("stop", matched=stop), completion_tokens=len(detok.ids),
            output_token_logprobs=_cut(chunk.output_token_logprobs, kept),
            output_top_logprobs=_cut(chunk.output_top_logprobs, kept),
            output_token_ids_logprobs=_cut(chunk.output_token_ids_logprobs, kept),
            output_token_ranks=_cut(chunk.output_token_ranks, kept))
