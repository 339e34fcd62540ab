"""The rules the OpenAI routes share (the model, a text to tokenize, sampling and stopping, logprobs, a prompt's
ids); each route module holds its own order of rules.

Pure functions of the body and the worker's ModelInfo, as generate/validation.py is for /generate. They raise the
ingress's typed errors with `param` naming the offending field; the routes give them OpenAI's shape.
"""

from __future__ import annotations

from ingress.errors import InvalidRequest, NotFound, enforce
from ingress.openai.schemas.common import SamplingFields
from rulebook import rules
from workers.protocol import ModelInfo, SamplingParams


def check_model(model: str | None, info: ModelInfo) -> None:
    """A named model must be the served one: a 404 that says which model this server has."""
    if model is not None and model != info.model_name:
        raise NotFound(
            f"The model `{model}` does not exist: this server serves `{info.model_name}` (GET /v1/models).",
            param="model")


def check_text(text: str, info: ModelInfo, param: str = "prompt") -> None:
    """A text the worker will tokenize: bounded by the context (max_prompt_chars_per_token) and valid UTF-8, so
    a worker never spends seconds on megabytes, nor fails on a lone surrogate (400 before any work)."""
    broken = rules.untokenizable(text, info.max_model_len, info.prompt_chars_per_token, param)
    if broken is not None:
        raise InvalidRequest(broken.message, param=param)


def check_logprobs(k: int | None, info: ModelInfo, param: str) -> None:
    """k alternatives per position (None: no logprobs): non-negative, and a server that computes logprobs. The
    upper bound is the server's `max_top_logprobs`, checked for every route as its work is opened (limits.py),
    and the vocabulary size (the rulebook's sampling table)."""
    if k is not None and k < 0:
        raise InvalidRequest(f"The {param} {k} must be non-negative.", param=param)
    if k is not None and info.logprobs_mode != "raw_logprobs":
        raise InvalidRequest(
            f"logprobs requires the server's raw_logprobs mode; it runs {info.logprobs_mode}.", param=param)


def sampling_params(body: SamplingFields, info: ModelInfo, max_tokens: int, k: int | None) -> SamplingParams:
    """The body's sampling and stopping with OpenAI's defaults for null, checked as /generate's rule 12 (every
    value that reaches the sampler or a tensor is in range); `stream_options` only with `stream`."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=-1 if body.top_k is None else body.top_k,
        min_p=0.0 if body.min_p is None else body.min_p, seed=body.seed,
        stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens, include_stop_str_in_output=body.include_stop_str_in_output,
        return_logprob=k is not None, top_logprobs_num=k or 0)
    enforce(rules.sampling_violation(params, info.vocab_size))
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options requires stream=true.", param="stream_options")
    return params


def include_usage(body: SamplingFields) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def check_unsupported(body: SamplingFields) -> None:
    """OpenAI parameters this server does not implement: a 400 rather than silently ignoring them."""
    if body.n not in (None, 1):
        raise InvalidRequest(
            f"n={body.n} is not supported: this server returns one choice per prompt, so n must be 1.", param="n")
    if body.logit_bias:
        raise InvalidRequest("logit_bias is not supported by this server.", param="logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0):
            raise InvalidRequest(f"{name}={getattr(body, name)} is not supported: only 0.", param=name)


def check_prompt(index: int | None, ids: list[int], max_tokens: int, info: ModelInfo, param: str = "prompt") -> None:
    """One prompt's ids (given, or its text tokenized) against the model; `index` names it in a batch."""
    where = "The prompt" if index is None else f"The prompt at index {index}"
    if not ids:
        raise InvalidRequest(f"{where} has no tokens.", param=param)
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"{where} holds token id {bad}, out of range for the vocabulary size {info.vocab_size}.", param=param)
    broken = rules.context_too_long(len(ids), max_tokens, info.max_model_len)
    if broken:
        raise InvalidRequest(broken.message if index is None else f"{where}: {broken.message}", param=param)
