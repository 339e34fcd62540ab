"""The rules of /v1/completions (first failure wins), and the body -> per-prompt carrier step.

Pure functions of the body and the worker's ModelInfo, as validation.py is for /generate. Errors carry
OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, `param` naming the offending field.

Unlike /generate (contract rule 9.3), a completion may score its prompt AND generate: `echo` with
`logprobs` asks for both, and one engine request (logprob_start_len=0, max_tokens > 0) does both, the
prompt rows coming from the same exact scoring path as /generate's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingress.errors import JSONAnswer
from ingress.openai_schemas import CompletionBody
from ingress.validation import CONTEXT_TOO_LONG, MAX_SEED
from workers.protocol import GenerateRequest, ModelInfo

# OpenAI's bound on `logprobs` for legacy completions.
MAX_LOGPROBS = 20
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


class OpenAIRequestError(Exception):
    """A request the /v1 routes answer with `status` (4xx) and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def answer(self) -> JSONAnswer:
        type_ = "not_found_error" if self.status == 404 else "invalid_request_error"
        return openai_error(self.message, self.status, type_=type_, param=self.param)


def openai_error(message: str, status: int, *, type_: str, param: str | None = None) -> JSONAnswer:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONAnswer(body, status_code=status)


def server_error(message: str, status: int = 503) -> JSONAnswer:
    return openai_error(message, status, type_="server_error")


@dataclass(frozen=True)
class CompletionSettings:
    """A validated body's settings with OpenAI's defaults applied (null = default)."""

    max_tokens: int
    echo: bool
    logprobs: int | None  # None: no logprobs at all; k >= 0: the token's own and k alternatives
    stream: bool
    include_usage: bool
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    include_stop_str_in_output: bool


def check_model(model: str | None, info: ModelInfo) -> None:
    """A named model must be the served one: a 404 that says which model this server has."""
    if model is not None and model != info.model_name:
        raise OpenAIRequestError(
            f"The model `{model}` does not exist: this server serves `{info.model_name}` (GET /v1/models).",
            param="model", status=404)


def validate_completion(body: CompletionBody, info: ModelInfo) -> CompletionSettings:
    """Raise OpenAIRequestError for the first rule the body breaks; return its settings otherwise.
    Prompt contents are checked later, once text prompts are tokenized (`check_prompt`)."""
    check_model(body.model, info)
    if body.n not in (None, 1):
        raise OpenAIRequestError(
            f"n={body.n} is not supported: this server returns one choice per prompt, so n must be 1.", "n")
    if body.best_of not in (None, 1):
        raise OpenAIRequestError(f"best_of={body.best_of} is not supported: only 1.", "best_of")
    if body.suffix is not None:
        raise OpenAIRequestError("suffix is not supported by this server.", "suffix")
    if body.logit_bias:
        raise OpenAIRequestError("logit_bias is not supported by this server.", "logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0):
            raise OpenAIRequestError(f"{name}={getattr(body, name)} is not supported: only 0.", name)
    _check_prompt_not_empty(body.prompt)
    echo = bool(body.echo)
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    if max_tokens < 0:
        raise OpenAIRequestError(f"The max_tokens {max_tokens} must be non-negative.", "max_tokens")
    if max_tokens == 0 and not echo:
        raise OpenAIRequestError("max_tokens 0 requires echo=true: it returns the prompt's logprobs only.",
                                 "max_tokens")
    k = body.logprobs
    if k is not None and not 0 <= k <= min(MAX_LOGPROBS, info.vocab_size):
        raise OpenAIRequestError(f"The logprobs {k} must be between 0 and {MAX_LOGPROBS}.", "logprobs")
    if k is not None and info.logprobs_mode != "raw_logprobs":
        raise OpenAIRequestError(
            f"logprobs requires the server's raw_logprobs mode; it runs {info.logprobs_mode}.", "logprobs")
    settings = CompletionSettings(
        max_tokens=max_tokens, echo=echo, logprobs=k, stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k, min_p=0.0 if body.min_p is None else body.min_p,
        seed=body.seed, stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens, include_stop_str_in_output=body.include_stop_str_in_output)
    _check_sampling(settings, info)
    if body.stream_options is not None and not settings.stream:
        raise OpenAIRequestError("stream_options requires stream=true.", "stream_options")
    return settings


def _check_prompt_not_empty(prompt: str | list) -> None:
    if prompt == "" or prompt == []:
        raise OpenAIRequestError("The prompt must not be empty.", "prompt")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if item == "" or item == []:
                raise OpenAIRequestError(f"The prompt at index {i} must not be empty.", "prompt")


def _check_sampling(s: CompletionSettings, info: ModelInfo) -> None:
    """Every value that reaches the sampler or a tensor is in range (as /generate's rule 12)."""
    v = info.vocab_size
    checks = (
        ("temperature", s.temperature >= 0, "must be non-negative"),
        ("top_p", 0 < s.top_p <= 1, "must be in (0, 1]"),
        ("top_k", -1 <= s.top_k <= v, f"must be -1 (disabled) or at most the vocabulary size {v}"),
        ("min_p", 0 <= s.min_p <= 1, "must be in [0, 1]"),
        ("seed", s.seed is None or 0 <= s.seed <= MAX_SEED, f"must be in [0, {MAX_SEED}]"),
    )
    for name, ok, rule in checks:
        if not ok:
            raise OpenAIRequestError(f"The {name} {getattr(s, name)} {rule}.", name)
    if any(stop == "" for stop in s.stop):
        # An empty stop string would match at every position and end generation at once.
        raise OpenAIRequestError("The stop strings must not be empty.", "stop")
    for token_id in s.stop_token_ids:
        if not 0 <= token_id < v:
            raise OpenAIRequestError(
                f"The stop_token_ids entry {token_id} is out of range for the vocabulary size {v}.",
                "stop_token_ids")


def prompt_items(prompt: str | list) -> list[str | list[int]]:
    """The body's prompt as a batch: each item a string or a token-id list (one choice each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def check_prompt(index: int, ids: list[int], s: CompletionSettings, info: ModelInfo, batch: bool) -> None:
    """One prompt's ids (given, or its text tokenized) against the model."""
    where = f"The prompt at index {index}" if batch else "The prompt"
    if not ids:
        raise OpenAIRequestError(f"{where} has no tokens.", "prompt")
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise OpenAIRequestError(
            f"{where} holds token id {bad}, out of range for the vocabulary size {info.vocab_size}.", "prompt")
    if len(ids) + s.max_tokens > info.max_model_len:
        message = CONTEXT_TOO_LONG.format(prompt_len=len(ids), max_tokens=s.max_tokens,
                                          context_len=info.max_model_len)
        raise OpenAIRequestError(f"{where}: {message}" if batch else message, "prompt")


def scores_prompt(ids: list[int], s: CompletionSettings) -> bool:
    """Whether the prompt's own logprobs are asked for and exist (its first token is never scored)."""
    return s.echo and s.logprobs is not None and len(ids) >= 2


def to_request(rid: str, ids: list[int], s: CompletionSettings) -> GenerateRequest | None:
    """The worker's carrier for one prompt; None when there is nothing to compute (an echo of the prompt,
    max_tokens 0, with no logprobs or a single token that nothing predicts)."""
    score = scores_prompt(ids, s)
    if s.max_tokens == 0 and not score:
        return None
    return GenerateRequest(
        rid=rid, input_ids=list(ids), max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
        top_k=s.top_k, min_p=s.min_p, seed=s.seed, stop=list(s.stop), stop_token_ids=list(s.stop_token_ids),
        ignore_eos=s.ignore_eos, skip_special_tokens=s.skip_special_tokens,
        include_stop_str_in_output=s.include_stop_str_in_output, return_logprob=s.logprobs is not None,
        logprob_start_len=0 if score else -1, top_logprobs_num=s.logprobs or 0)
