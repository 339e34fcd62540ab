"""Carriers: the only things that cross the ingress <-> worker process boundary for a request.

Plain dataclasses of builtins (no tensors, no engine state), so they pickle small. Logprob fields keep None ("not
requested") and [] ("requested, empty") distinct; a stream's final chunk carries only what is new, never a replay of
earlier chunks.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from protocol.images import ImageData
from protocol.outputs import CONCAT, FinishReason
from protocol.sampling import SamplingParams


@dataclass
class GenerateRequest:
    """One worker request: a prompt's token ids and how to score, sample and stop. Every dialect's parse makes it
    whole (a text prompt tokenized where the request enters: ingress/text.py), so nothing on the way to the engine
    tokenizes."""

    rid: str
    input_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    # The worker requests of one HTTP request share a group (ingress/fan_out.py): the worker admits them as one unit
    # and counts once the first `shared_tokens` of input_ids, which an earlier request of the group has too.
    group: str | None = None
    shared_tokens: int = 0
    # The prompt's images in order, preprocessed by the ingress; input_ids holds each one's placeholder run already
    # expanded (ImageData.num_tokens placeholder ids). None: a text-only prompt.
    images: list[ImageData] | None = None


@dataclass
class GenerateChunk:
    """One delta of a request's answer: what is new since the previous chunk."""

    rid: str
    # The generated text: the worker leaves it empty (it returns ids and logprobs); the ingress writes it from
    # output_ids with its own tokenizer, stop strings matched (ingress/output/).
    text: str = field(default="", metadata=CONCAT)
    output_ids: list[int] = field(default_factory=list, metadata=CONCAT)
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # [[value, token_id], ...] | None
    input_token_logprobs: list[list] | None = field(default=None, metadata=CONCAT)
    input_top_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    output_token_logprobs: list[list] | None = field(default=None, metadata=CONCAT)
    output_top_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, [[value, token_id], ...] of the request's token_ids_logprob | None.
    input_token_ids_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, its token's rank in the row (params.return_input_ranks) | None.
    input_token_ranks: list[int] | None = field(default=None, metadata=CONCAT)
    # Per generated token, [[value, token_id], ...] of the request's token_ids_logprob | None.
    output_token_ids_logprobs: list[list[list]] | None = field(default=None, metadata=CONCAT)
    # Per generated token, its rank in the row it was sampled from (params.return_output_ranks) | None.
    output_token_ranks: list[int] | None = field(default=None, metadata=CONCAT)
    # The request's input_logprob_temperature, echoed; None when it did not set one.
    input_logprob_temperature: float | None = None
    # A classify request's raw float32 scores at its pooled position ([num_labels]), on its final chunk.
    pooled: list[float] | None = None
    # The weights the request ran on (every chunk of a request carries the same: weights change between requests).
    weight_version: str | None = None
    # The worker's ModelInfo.version when the request started: the ingress refreshes its copy when it differs.
    info_version: str | None = None


def error_chunk(rid: str, message: str, code: int | None = None, after: GenerateChunk | None = None) -> GenerateChunk:
    """The final delta of a request that ends in error: nothing new, finish_reason `error` with `message`.

    `code`: 400 when the request was bad, 500 (or None) when the server failed. `after` is the last delta the
    stream sent, if any: its totals repeat (they are totals, not deltas), and a logprob field it carried
    (requested) is [] here while one it did not stays None, so the stream still concatenates.
    """

    def empty_like(name: str) -> list | None:
        return None if after is None or getattr(after, name) is None else []

    return GenerateChunk(
        rid=rid, finished=True, finish_reason=FinishReason("error", message=message, code=code),
        prompt_tokens=after.prompt_tokens if after else 0,
        completion_tokens=after.completion_tokens if after else 0,
        cached_tokens=after.cached_tokens if after else 0,
        input_token_logprobs=empty_like("input_token_logprobs"), input_top_logprobs=empty_like("input_top_logprobs"),
        output_token_logprobs=empty_like("output_token_logprobs"),
        output_top_logprobs=empty_like("output_top_logprobs"),
        input_token_ids_logprobs=empty_like("input_token_ids_logprobs"),
        input_token_ranks=empty_like("input_token_ranks"),
        output_token_ids_logprobs=empty_like("output_token_ids_logprobs"),
        output_token_ranks=empty_like("output_token_ranks"),
        input_logprob_temperature=after.input_logprob_temperature if after else None,
        pooled=after.pooled if after else None, weight_version=after.weight_version if after else None,
        info_version=after.info_version if after else None)


async def until_finished(stream: AsyncGenerator[GenerateChunk, None]) -> list[GenerateChunk]:
    """A stream's chunks up to its final one, the stream closed after (which aborts a request left unfinished):
    what a caller that wants the whole answer merges (the worker's generate_whole; the ingress tests' fake)."""
    chunks: list[GenerateChunk] = []
    async with contextlib.aclosing(stream) as s:
        async for chunk in s:
            chunks.append(chunk)
            if chunk.finished:
                break
    return chunks
