"""The text of a worker request's answer, made in the ingress from the ids the worker streams back.

The worker returns ids and logprobs only; here each delta gets its text (protocol/detokenizer.py) and stop strings
are matched, as vLLM's API server does (its OutputProcessor). When a stop string matches, the answer ends at the
token that completed it, exactly where the engine ended it when it matched stop strings itself: its ids, logprob
rows and completion_tokens stop there, and the finish is `stop` with the string. The engine may have generated a
few more tokens meanwhile (it learns of the stop when the ingress closes the worker call, which aborts the
request); they are dropped here and never reach the answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from protocol import FinishReason, GenerateChunk, SamplingParams
from protocol.detokenizer import IncrementalDetokenizer


def _cut(rows: list | None, n: int) -> list | None:
    return None if rows is None else rows[:n]


class AnswerText:
    """One worker request's deltas -> the same deltas with their text, cut at the first stop string."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, params)

    @property
    def stopped(self) -> bool:
        """A stop string ended the answer: the worker's request must be ended too (its call closed)."""
        return self._detok.stopped_by is not None

    def feed(self, chunk: GenerateChunk) -> GenerateChunk:
        """`chunk` with its text; a chunk in which a stop string completes is the answer's last: the ids and logprob
        rows after the stopping token are dropped and the finish says which string matched."""
        got = chunk.output_ids
        kept = self._detok.add(got)
        stop = self._detok.stopped_by
        if stop is None:
            return dataclasses.replace(chunk, text=self._detok.delta(chunk.finished))
        return dataclasses.replace(
            chunk, text=self._detok.delta(True), output_ids=got[:kept], finished=True,
            finish_reason=FinishReason("stop", matched=stop), completion_tokens=len(self._detok.ids),
            output_token_logprobs=_cut(chunk.output_token_logprobs, kept),
            output_top_logprobs=_cut(chunk.output_top_logprobs, kept),
            output_token_ids_logprobs=_cut(chunk.output_token_ids_logprobs, kept),
            output_token_ranks=_cut(chunk.output_token_ranks, kept))
