"""Carriers: the only things that cross the ingress <-> worker process boundary for a request: a GenerateRequest
in, the engine's own RequestOutput deltas out (protocol/outputs.py: one output type, no copy per delta).

Plain dataclasses of builtins (no tensors, no engine state), so they pickle small. Logprob fields keep None ("not
requested") and [] ("requested, empty") distinct; a stream's final delta carries only what is new, never a replay of
earlier deltas.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from protocol.images import ImageData
from protocol.outputs import FinishReason, RequestOutput
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


def error_chunk(rid: str, message: str, code: int | None = None,
                after: RequestOutput | None = None) -> RequestOutput:
    """The final delta of a request that ends in error: nothing new, finish_reason `error` with `message`.

    `code`: 400 when the request was bad, 500 (or None) when the server failed. `after` is the last delta the
    stream sent, if any: its totals repeat (they are totals, not deltas), and a logprob field it carried
    (requested) is [] here while one it did not stays None, so the stream still concatenates.
    """

    def empty_like(name: str) -> list | None:
        return None if after is None or getattr(after, name) is None else []

    return RequestOutput(
        request_id=rid, finished=True, finish_reason=FinishReason("error", message=message, code=code),
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


async def until_finished(stream: AsyncGenerator[RequestOutput, None]) -> list[RequestOutput]:
    """A stream's chunks up to its final one, the stream closed after (which aborts a request left unfinished):
    what a caller that wants the whole answer merges (the worker's generate_whole; the ingress tests' fake)."""
    chunks: list[RequestOutput] = []
    async with contextlib.aclosing(stream) as s:
        async for chunk in s:
            chunks.append(chunk)
            if chunk.finished:
                break
    return chunks
