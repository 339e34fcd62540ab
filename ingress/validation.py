"""The contract's 400 rules, in the contract's order (first failure wins), and the body -> carrier step.

Pure functions of the body and the worker's ModelInfo: no I/O, so they are tested exactly and alone.
"""

from __future__ import annotations

import uuid

from ingress.errors import RequestError
from ingress.request_record import current_request_id
from ingress.schemas import GenerateBody
from workers.protocol import GenerateRequest, ModelInfo

# Modes in which input tokens can be scored: values come straight from the raw logits.
SCORING_MODES = ("raw_logits", "raw_logprobs")

# Rule 10 and rule 11 texts. The engine checks a text prompt against rule 11 after tokenizing it, with
# this same text, and the worker sends it back as an error finish with code 400.
TOKEN_OUT_OF_RANGE = "Token id {token_id} is out of range for the vocabulary size {vocab_size}."
CONTEXT_TOO_LONG = "The prompt length {prompt_len} plus max_tokens {max_tokens} exceeds the model's context length {context_len}."

# Torch generators take seeds in [0, 2**64); the bound also stops a 10**30 seed before it reaches a tensor.
MAX_SEED = 2**63 - 1


def validate(body: GenerateBody, info: ModelInfo, prompt_len: int | None = None) -> None:
    """Raise RequestError with the first failing rule's message; return when the body is valid.

    `prompt_len` is the token count of a text prompt when the caller knows it. The ingress does not
    (it has no tokenizer), so for a text prompt rule 11 is the worker's, after tokenizing.
    """
    k = body.top_logprobs_num
    # 1-3: logprob options.
    if k is not None and k < 0:
        raise RequestError(f"The top_logprobs_num {k} cannot be a negative integer.")
    if k is not None and k > 0 and body.return_logprob is not True:
        raise RequestError("top_logprobs_num requires return_logprob=True.")
    if body.return_logprob is True and info.logprobs_mode == "none":
        raise RequestError(
            "return_logprob(True) requested but not enabled logprobs_mode in engine configuration."
        )
    # 4-7: the prompt.
    if (body.prompt is None) == (body.input_ids is None):
        raise RequestError("You must specify exactly one of prompt or input_ids")
    if body.prompt == "":
        raise RequestError("The prompt must not be an empty string")
    if body.input_ids == []:
        raise RequestError("The input_ids must not be an empty list")
    if body.image_data is not None:
        raise RequestError("image input is not supported by this server.")
    # 8-9: what to compute.
    if body.max_tokens < 0:
        raise RequestError(f"The max_tokens {body.max_tokens} must be non-negative.")
    _check_scoring(body, info)
    # 10-11: the prompt against the model.
    for token_id in body.input_ids or ():
        if not 0 <= token_id < info.vocab_size:
            raise RequestError(TOKEN_OUT_OF_RANGE.format(token_id=token_id, vocab_size=info.vocab_size))
    n = len(body.input_ids) if body.input_ids is not None else prompt_len
    if n is not None and n + body.max_tokens > info.max_model_len:
        raise RequestError(
            CONTEXT_TOO_LONG.format(prompt_len=n, max_tokens=body.max_tokens, context_len=info.max_model_len)
        )
    _check_sampling(body, info)


def _check_scoring(body: GenerateBody, info: ModelInfo) -> None:
    """Rule 9: input-token scoring (logprob_start_len >= 0) is scoring only, over given ids."""
    n = body.logprob_start_len
    if n < 0:
        # Without a scoring boundary, max_tokens=0 would compute nothing.
        if body.max_tokens == 0:
            raise RequestError("The max_tokens 0 must be a positive integer.")
        return
    if body.return_logprob is not True:
        raise RequestError("logprob_start_len requires return_logprob=True.")
    if info.logprobs_mode not in SCORING_MODES:
        raise RequestError("logprob_start_len requires raw_logits or raw_logprobs mode.")
    if body.max_tokens != 0:
        raise RequestError("logprob_start_len requires max_tokens=0.")
    if body.input_ids is None:
        raise RequestError("logprob_start_len requires input_ids.")
    # Rows score ids[N+1:], so at least one id must follow the boundary.
    if n + 1 >= len(body.input_ids):
        raise RequestError(
            f"logprob_start_len({n}) exceeds the last scorable source position "
            f"for input_ids length({len(body.input_ids)})."
        )


def _check_sampling(body: GenerateBody, info: ModelInfo) -> None:
    """Rule 12: every value that reaches the sampler or a tensor is in range; the message names the field.

    Upper bounds on integers matter as much as lower ones: a 10**30 that reached a torch call would be
    a 5xx, and nothing a client sends may be.
    """
    v = info.vocab_size
    if body.temperature < 0:
        raise RequestError(f"The temperature {body.temperature} must be non-negative.")
    if not 0 < body.top_p <= 1:
        raise RequestError(f"The top_p {body.top_p} must be in (0, 1].")
    if not -1 <= body.top_k <= v:
        raise RequestError(
            f"The top_k {body.top_k} must be -1 (disabled) or at most the vocabulary size {v}."
        )
    if not 0 <= body.min_p <= 1:
        raise RequestError(f"The min_p {body.min_p} must be in [0, 1].")
    if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
        raise RequestError(f"The seed {body.seed} must be in [0, {MAX_SEED}].")
    if body.top_logprobs_num is not None and body.top_logprobs_num > v:
        raise RequestError(f"The top_logprobs_num {body.top_logprobs_num} exceeds the vocabulary size {v}.")
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    if any(s == "" for s in stops):
        # An empty stop string would match at every position and end generation at once.
        raise RequestError("The stop strings must not be empty.")
    for token_id in body.stop_token_ids or ():
        if not 0 <= token_id < v:
            raise RequestError(
                f"The stop_token_ids entry {token_id} is out of range for the vocabulary size {v}."
            )


def to_request(body: GenerateBody) -> GenerateRequest:
    """The worker's carrier for a validated body; the request id is the body's `rid`, else the HTTP request's
    (X-Request-ID or made by the middleware), else a new one."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return GenerateRequest(
        rid=body.rid or current_request_id() or uuid.uuid4().hex,
        input_ids=list(body.input_ids) if body.input_ids is not None else None,
        prompt=body.prompt,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        stop=stop,
        stop_token_ids=list(body.stop_token_ids or []),
        ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens,
        include_stop_str_in_output=body.include_stop_str_in_output,
        return_logprob=bool(body.return_logprob),
        logprob_start_len=body.logprob_start_len,
        top_logprobs_num=body.top_logprobs_num or 0,
    )
