"""The rules of /v1/completions (first failure wins), and the body -> per-prompt carrier step.

Pure functions of the body and the worker's ModelInfo, as validation.py is for /generate. They raise the
ingress's typed errors with `param` naming the offending field; the routes give them OpenAI's shape.

Unlike /generate (contract rule 9.3), a completion may score its prompt AND generate: `echo` with
`logprobs` asks for both, and one engine request (logprob_start_len=0, max_tokens > 0) does both, the
prompt rows coming from the same exact scoring path as /generate's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ingress.errors import InvalidRequest, NotFound, enforce
from ingress.openai.schemas import CompletionBody, SamplingFields
from rulebook import rules
from workers.protocol import GenerateRequest, ModelInfo, SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


@dataclass(frozen=True)
class CompletionSettings:
    """A validated body's settings with OpenAI's defaults applied (null = default)."""

    echo: bool
    logprobs: int | None  # None: no logprobs at all; k >= 0: the token's own and k alternatives
    stream: bool
    include_usage: bool
    # Every prompt's parameters but the scoring boundary, which depends on the prompt (`prompt_request`).
    params: SamplingParams


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


def validate_completion(body: CompletionBody, info: ModelInfo) -> CompletionSettings:
    """Raise InvalidRequest (or NotFound) for the first rule the body breaks; return its settings otherwise.
    Prompt contents are checked later, once text prompts are tokenized (`check_prompt`)."""
    check_model(body.model, info)
    check_unsupported(body)
    if body.best_of not in (None, 1):
        raise InvalidRequest(f"best_of={body.best_of} is not supported: only 1.", param="best_of")
    if body.suffix is not None:
        raise InvalidRequest("suffix is not supported by this server.", param="suffix")
    _check_prompt_not_empty(body.prompt)
    echo = bool(body.echo)
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    enforce(rules.negative_max_tokens(max_tokens), param="max_tokens")
    if max_tokens == 0 and not echo:
        raise InvalidRequest("max_tokens 0 requires echo=true: it returns the prompt's logprobs only.",
                             param="max_tokens")
    k = body.logprobs
    check_logprobs(k, info, "logprobs")
    params = sampling_params(body, info, max_tokens, k)
    return CompletionSettings(echo=echo, logprobs=k, stream=bool(body.stream), include_usage=include_usage(body),
                              params=params)


def check_logprobs(k: int | None, info: ModelInfo, param: str) -> None:
    """k alternatives per position (None: no logprobs): non-negative, and a server that computes logprobs. The
    upper bound is the server's `max_top_logprobs`, checked for every route as its work is opened (limits.py),
    and the vocabulary size (the rulebook's sampling table)."""
    if k is not None:
        enforce(rules.negative(param, k), param=param)
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


def _check_prompt_not_empty(prompt: str | list) -> None:
    if prompt == "" or prompt == []:
        raise InvalidRequest("The prompt must not be empty.", param="prompt")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if item == "" or item == []:
                raise InvalidRequest(f"The prompt at index {i} must not be empty.", param="prompt")


def prompt_items(prompt: str | list) -> list[str | list[int]]:
    """The body's prompt as a batch: each item a string or a token-id list (one choice each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


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


def scores_prompt(ids: list[int], s: CompletionSettings) -> bool:
    """Whether the prompt's own logprobs are asked for and exist (its first token is never scored)."""
    return s.echo and s.logprobs is not None and len(ids) >= 2


def prompt_request(rid: str, ids: list[int], s: CompletionSettings) -> GenerateRequest | None:
    """The worker's carrier for one prompt; None when there is nothing to compute (an echo of the prompt,
    max_tokens 0, with no logprobs or a single token that nothing predicts)."""
    score = scores_prompt(ids, s)
    if s.params.max_tokens == 0 and not score:
        return None
    return GenerateRequest(rid=rid, input_ids=list(ids), params=replace(s.params, logprob_start_len=0 if score else -1))
