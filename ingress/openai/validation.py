"""The rules the OpenAI routes share (the model, a text to tokenize, sampling and stopping, logprobs, a prompt's
ids); each route module holds its own order of rules.

Pure functions of the body and the worker's ModelInfo, as generate/validation.py is for /generate. They raise the
ingress's typed errors with `param` naming the offending field; the routes give them OpenAI's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ingress.errors import InvalidRequest, NotFound, enforce
from ingress.openai.schemas.common import SamplingFields
from protocol import ModelInfo, SamplingParams
from protocol.sampling import stop_list
from rulebook import openai as msg
from rulebook import openai_fields, rules, vllm_generate

# The logprobs modes whose values are logprobs (raw_logits are not; none computes none).
LOGPROB_MODES = ("raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class VllmFields:
    """vLLM's fields a completion or chat answer follows, validated (docs/vllm.md)."""

    prompt_logprobs: int | None  # k alternatives per prompt position (-1 resolved to the vocabulary); None: none
    token_ids: bool  # return_token_ids: prompt_token_ids and each choice's token_ids
    as_ids: bool  # return_tokens_as_token_ids: logprob tokens as "token_id:<id>"
    flat_b64: bool  # return_flat_logprobs_b64: logprobs as flat base64 arrays
    # processed_logprobs: prompt rows at the request's temperature (None: at 1, the raw rows).
    score_temperature: float | None
    # logprob_token_ids: each generated token reports these ids' values in place of its k most likely.
    logprob_token_ids: list[int] | None = None


def check_fields(body: SamplingFields) -> None:
    """The body's fields by rulebook/openai_fields.py: of those it does not declare only annotations pass, and a
    refused one it declares (`n`, the penalties, `tools`, ...) passes at a neutral value only."""
    for name, value in (body.model_extra or {}).items():
        enforce(openai_fields.undeclared_field(name, value))
    for name in type(body).model_fields:
        if name in openai_fields.REFUSED:
            enforce(openai_fields.refused_value(name, getattr(body, name)))


def vllm_fields(body: SamplingFields, info: ModelInfo, params: SamplingParams) -> VllmFields:
    """vLLM's rules for its fields (prompt_logprobs: k >= -1, not with a stream unless 0), the logprobs mode they
    need, and processed_logprobs' refusal of the sampling filters it does not apply to logprobs."""
    enforce(openai_fields.prompt_logprobs_violation(body.prompt_logprobs, bool(body.stream)))
    k = None if body.stream else body.prompt_logprobs  # 0 with a stream: vLLM streams no prompt logprobs
    check_logprobs(None if k is None else 0, info, "prompt_logprobs")
    processed = info.logprobs_mode == "processed_logprobs"
    if processed and (k is not None or params.return_logprob):
        for name, value, default in (("top_p", params.top_p, 1.0), ("top_k", params.top_k, -1),
                                     ("min_p", params.min_p, 0.0)):
            if value != default and not (name == "top_k" and value == 0):
                raise InvalidRequest(openai_fields.PROCESSED_FILTERS.format(name=name, value=value), param=name)
    temp = params.temperature if processed and params.temperature > 0 and params.temperature != 1.0 else None
    ids = body.logprob_token_ids
    if ids is not None and not params.return_logprob:
        raise InvalidRequest(openai_fields.IDS_NEED_LOGPROBS, param="logprob_token_ids")

    return VllmFields(prompt_logprobs=info.vocab_size if k == -1 else k, token_ids=bool(body.return_token_ids),
                      as_ids=bool(body.return_tokens_as_token_ids), flat_b64=body.return_flat_logprobs_b64,
                      score_temperature=temp, logprob_token_ids=list(ids) if ids is not None else None)


def scoring_params(params: SamplingParams, fields: VllmFields) -> SamplingParams:
    """The worker's parameters for a prompt whose rows are asked for (echo's logprobs, prompt_logprobs): scored from
    position 0, as wide as the widest ask (each answer keeps its own k), with ranks for prompt_logprobs."""
    out = replace(params, logprob_start_len=0, return_logprob=True,
                  input_logprob_temperature=fields.score_temperature)
    if fields.prompt_logprobs is not None:
        out = replace(out, top_logprobs_num=max(out.top_logprobs_num, fields.prompt_logprobs), return_input_ranks=True)
    return out


def check_model(model: str | None, info: ModelInfo) -> None:
    """A named model must be the served one: a 404 that says which model this server has."""
    if model is not None and model != info.model_name:
        raise NotFound(msg.UNKNOWN_MODEL.format(model=model, served=info.model_name), param="model")


def check_text(text: str, info: ModelInfo, param: str = "prompt") -> None:
    """A text to tokenize: bounded by the context (max_prompt_chars_per_token) and valid UTF-8, so the
    tokenizer never spends seconds on megabytes, nor fails on a lone surrogate (400 before any work)."""
    broken = rules.untokenizable(text, info.max_model_len, info.prompt_chars_per_token, param)
    if broken is not None:
        raise InvalidRequest(broken.message, param=param)


def check_logprobs(k: int | None, info: ModelInfo, param: str) -> None:
    """k alternatives per position (None: no logprobs): non-negative, and a server that computes logprobs. The
    upper bound is the server's `max_top_logprobs`, checked for every route as its work is opened (limits.py),
    and the vocabulary size (the rulebook's sampling table)."""
    if k is not None:
        enforce(rules.negative(param, k), param=param)
    if k is not None and info.logprobs_mode not in LOGPROB_MODES:
        raise InvalidRequest(msg.LOGPROBS_MODE.format(mode=info.logprobs_mode), param=param)


def sampling_params(body: SamplingFields, info: ModelInfo, max_tokens: int, k: int | None) -> SamplingParams:
    """The body's sampling and stopping with OpenAI's defaults for null, checked as /generate's rule 12 (every
    value that reaches the sampler or a tensor is in range); `stream_options` only with `stream`."""
    ids = body.logprob_token_ids  # vLLM's rules (at most 128, in the vocabulary) and names, before the sampler's
    enforce(vllm_generate.logprob_ids_violation(ids, None, info.vocab_size))
    params = SamplingParams(
        max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=-1 if body.top_k is None else body.top_k,
        min_p=0.0 if body.min_p is None else body.min_p, seed=body.seed,
        stop=stop_list(body.stop),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens, include_stop_str_in_output=body.include_stop_str_in_output,
        return_logprob=k is not None, top_logprobs_num=k or 0,
        token_ids_logprob=list(ids) if ids is not None and k is not None else None)
    enforce(rules.sampling_violation(params, info.vocab_size))
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest(msg.STREAM_OPTIONS, param="stream_options")
    return params


def include_usage(body: SamplingFields) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def check_prompt(index: int | None, ids: list[int], max_tokens: int, info: ModelInfo, param: str = "prompt") -> None:
    """One prompt's ids (given, or its text tokenized) against the model; `index` names it in a batch."""
    where = "The prompt" if index is None else msg.PROMPT_AT.format(index=index)
    if not ids:
        raise InvalidRequest(msg.PROMPT_NO_TOKENS.format(where=where), param=param)
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(msg.PROMPT_TOKEN_RANGE.format(where=where, bad=bad, vocab_size=info.vocab_size),
                             param=param)
    broken = rules.context_too_long(len(ids), max_tokens, info.max_model_len)
    if broken:
        raise InvalidRequest(broken.message if index is None else f"{where}: {broken.message}", param=param)
