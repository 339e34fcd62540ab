"""Engine objects -> carriers. The only place that knows both sides' shapes."""

from __future__ import annotations

from engine.outputs import RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams
from workers.protocol import FinishInfo, GenerateChunk, GenerateRequest


def to_params(req: GenerateRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
        min_p=req.min_p, seed=req.seed, stop=list(req.stop), stop_token_ids=list(req.stop_token_ids),
        ignore_eos=req.ignore_eos, skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output, return_logprob=req.return_logprob,
        logprob_start_len=req.logprob_start_len, top_logprobs_num=req.top_logprobs_num)


def _rows(rows: list[TokenLogprob] | None) -> list[list] | None:
    return None if rows is None else [[v, t] for v, t in rows]


def _tops(rows: list[list[TokenLogprob]] | None) -> list[list[list]] | None:
    return None if rows is None else [[[v, t] for v, t in row] for row in rows]


def to_chunk(out: RequestOutput) -> GenerateChunk:
    fr = out.finish_reason
    return GenerateChunk(
        rid=out.request_id, text=out.new_text, output_ids=list(out.new_token_ids), finished=out.finished,
        finish_reason=None if fr is None else FinishInfo(fr.type, fr.matched, fr.message, fr.code),
        prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        input_token_logprobs=_rows(out.input_token_logprobs), input_top_logprobs=_tops(out.input_top_logprobs),
        output_token_logprobs=_rows(out.output_token_logprobs),
        output_top_logprobs=_tops(out.output_top_logprobs))


def error_chunk(rid: str, message: str, code: int, prompt_tokens: int = 0) -> GenerateChunk:
    return GenerateChunk(rid=rid, finished=True, prompt_tokens=prompt_tokens,
                         finish_reason=FinishInfo("error", message=message, code=code))
