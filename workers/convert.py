"""Engine outputs -> carriers: the only place that knows both sides' shapes.

Requests need no conversion: a GenerateRequest carries the engine's own SamplingParams.
"""

from __future__ import annotations

from protocol import GenerateChunk
from protocol.outputs import RequestOutput, TokenLogprob
from protocol.sampling import SamplingParams


def _rows(rows: list[TokenLogprob] | None) -> list[list] | None:
    return None if rows is None else [[v, t] for v, t in rows]


def _tops(rows: list[list[TokenLogprob]] | None) -> list[list[list]] | None:
    return None if rows is None else [[[v, t] for v, t in row] for row in rows]


def to_chunk(out: RequestOutput, params: SamplingParams | None = None, weight_version: str | None = None,
             info_version: str | None = None) -> GenerateChunk:
    """params: the request's, for what its answer echoes (input_logprob_temperature); weight_version: the weights
    it runs on (read when each delta is built: the engine changes weights only between requests); info_version:
    the worker's ModelInfo.version when the request started (the ingress refreshes its copy when it differs)."""
    return GenerateChunk(
        rid=out.request_id, output_ids=list(out.new_token_ids), finished=out.finished,
        finish_reason=out.finish_reason, prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        input_token_logprobs=_rows(out.input_token_logprobs), input_top_logprobs=_tops(out.input_top_logprobs),
        output_token_logprobs=_rows(out.output_token_logprobs),
        output_top_logprobs=_tops(out.output_top_logprobs),
        input_token_ids_logprobs=_tops(out.input_token_ids_logprobs),
        input_token_ranks=out.input_token_ranks,
        output_token_ids_logprobs=_tops(out.output_token_ids_logprobs),
        output_token_ranks=out.output_token_ranks,
        input_logprob_temperature=params.input_logprob_temperature if params is not None else None,
        pooled=out.pooled, weight_version=weight_version, info_version=info_version)
