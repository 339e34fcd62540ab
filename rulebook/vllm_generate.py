"""vLLM 0.32's token-in route, POST /inference/v1/generate: which `sampling_params` and body fields this server
honours, which it accepts only at their neutral value, and the messages of its rules (vLLM's own texts where vLLM has
one: vllm/sampling_params.py, vllm/v1/engine/input_processor.py, the route's serving module).

A field that changes what is computed and is not honoured is a 400 naming it (refused.py, as every dialect's); an
unknown field is a 400 too (vLLM's SamplingParams would reject it as well), so a typo never vanishes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rulebook.refused import Refused, Why, refusal
from rulebook.rules import Violation

# vLLM's bound on logprob_token_ids (MAX_LOGPROB_TOKEN_IDS: the sampler's per-request row width).
MAX_LOGPROB_TOKEN_IDS = 128

HONOURED_SAMPLING = (
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "include_stop_str_in_output", "logprobs", "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start",
    "logprob_token_ids", "flat_logprobs", "detokenize", "skip_special_tokens",
)
# Refused unless at these values (each is vLLM's default, or a value that computes the same).
REFUSED_SAMPLING: Mapping[str, Refused] = {
    "n": Refused(Why.ONE_CHOICE, (1,)),
    "presence_penalty": Refused(Why.PENALTY, (0, 0.0)), "frequency_penalty": Refused(Why.PENALTY, (0, 0.0)),
    "repetition_penalty": Refused(Why.PENALTY, (1, 1.0)), "min_tokens": Refused(Why.MIN_LENGTH, (0,)),
    "logit_bias": Refused(Why.LOGIT_BIAS, ({},)), "allowed_token_ids": Refused("allow-lists are not implemented"),
    "bad_words": Refused("banned words are not implemented", ([],)), "structured_outputs": Refused(Why.GRAMMAR),
    "spaces_between_special_tokens": Refused(Why.DEFAULT_SPACING, (True,)),
    "truncate_prompt_tokens": Refused("prompts are never truncated: a long one is a 400"),
    "output_kind": Refused("a stream sends deltas", (0, 1, 2)), "extra_args": Refused(Why.EXTENSIONS, ({},)),
    "thinking_token_budget": Refused(Why.REASONING),
    "repetition_detection": Refused("repetition detection is not implemented"),
    "routed_experts_prompt_start": Refused(Why.ROUTED_EXPERTS, (0,)),
    "skip_reading_prefix_cache": Refused("the prefix cache is always read"),
    "stream_interval": Refused(Why.EVERY_TOKEN, (1,)), "logits_processors": Refused(Why.LOGIT_PROCESSORS, ([],)),
    "return_routed_experts": Refused(Why.ROUTED_EXPERTS, (False,)),
}
HONOURED_BODY = ("request_id", "token_ids", "sampling_params", "model", "stream", "stream_options",
                 "return_token_ids", "content_parts")
REFUSED_BODY: Mapping[str, Refused] = {
    "output_mode": Refused("the answer is token ids (POST /detokenize decodes them)", ("tokens",)),
    "cache_salt": Refused(Why.SHARED_CACHE), "priority": Refused(Why.ARRIVAL_ORDER, (0,)),
    "kv_transfer_params": Refused(Why.DISAGGREGATION), "ec_transfer_params": Refused(Why.DISAGGREGATION),
    "features": Refused("vLLM's /render output (its processor's tensors, msgpack-serialized) is not taken: send the "
                        "images as `content_parts` beside the same token_ids"),
    "reasoning_ended": Refused(Why.NOT_PARSED),
    "reasoning_parser_kwargs": Refused(Why.NOT_PARSED), "token_offsets": Refused("token offsets are not taken"),
}

UNKNOWN = ("Unknown field `{name}`: vLLM's /inference/v1/generate does not have it, and this server refuses it "
           "rather than ignore it (docs/vllm.md).")
PROMPT_IDS_STREAM = "prompt_logprob_token_ids are not available when stream=true."
# vLLM's texts.
TEMPERATURE = "temperature must be in [0, 2], got {value}."
TEMPERATURE_NEGATIVE = "temperature must be non-negative, got {value}."
TOP_P = "top_p must be in (0, 1], got {value}."
TOP_K = "top_k must be 0 (disable), or at least 1, got {value}."
MIN_P = "min_p must be in [0, 1], got {value}."
MAX_TOKENS = "max_tokens must be at least 1, got {value}."
LOGPROBS = "logprobs must be non-negative or -1, got {value}."
PROMPT_LOGPROBS = "prompt_logprobs must be non-negative or -1, got {value}."
EMPTY_STOP = "stop cannot contain an empty string."
STOP_NEEDS_DETOKENIZE = "stop strings are only supported when detokenize is True. Set detokenize=True to use stop."
OVER_MAX = "Requested {what} of {value}, which is greater than max allowed: {limit}"
IDS_TOO_MANY = "Requested logprob_token_ids of length {n}, which is greater than max allowed: {limit}"
IDS_OUT_OF_VOCAB = ("token_id(s) {bad} in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: "
                    "{vocab}")
IDS_COUNT = ("When both logprobs and logprob_token_ids are set, logprobs must equal len(logprob_token_ids). Got "
             "logprobs={logprobs}, len(logprob_token_ids)={n}.")
ROWS_SHAPE = "prompt_logprob_token_ids must be a non-empty integer array of shape [num_rows, num_ids]."
ROWS_WIDE = ("Requested {n} token ids per row in prompt_logprob_token_ids, which is greater than max allowed: "
             "{limit}. Set max_logprobs (--max-logprobs) to at least {n}.")
ROWS_OUT_OF_VOCAB = "prompt_logprob_token_ids contain out-of-vocab token ids (-1 pads a row). Vocabulary size: {vocab}"
ROWS_COUNT = ("prompt_logprob_token_ids has {rows} rows, but the prompt has {scored} scored rows "
              "(prompt_len - 1 - prompt_logprob_start).")
START_NEGATIVE = "prompt_logprob_start must be non-negative."
START_NEEDS_ROWS = "prompt_logprob_start requires prompt_logprob_token_ids."
NEGATIVE_IDS = "token_ids must not contain negative values"
ABORT_IDS = "Missing 'request_ids' in request body"
# vLLM's RL routes (ingress/vllm/rl_routes.py).
PAUSE_MODE = "The mode {mode!r} is not one of vLLM's pause modes: abort, wait, keep."
QUERY_BOOL = "The query parameter {name}={value!r} must be true or false."
INVALID_JSON = "Invalid JSON format"
NOT_OBJECT = "Request body must be a JSON object"
IDS_NOT_STRINGS = "The request_ids must be a list of request id strings."


def field_violation(name: str, value: Any, honoured: tuple[str, ...], refused: Mapping[str, Refused],
                    where: str = "") -> Violation | None:
    """A field of the body (where "") or of sampling_params (where "sampling_params."): honoured, neutral, or a 400."""
    if name in honoured:
        return None
    param = f"{where}{name}"
    if name not in refused:
        return Violation(UNKNOWN.format(name=param), param=param)
    return refusal(param, value, refused[name], "docs/vllm.md")


def sampling_violation(sp: Mapping[str, Any]) -> Violation | None:
    """vLLM's SamplingParams._verify_args, in its order, for the fields this server honours."""
    temp = sp.get("temperature", 1.0)
    if temp is not None:
        if not math.isfinite(temp) or temp > 2.0:
            return Violation(TEMPERATURE.format(value=temp), param="temperature")
        if temp < 0.0:
            return Violation(TEMPERATURE_NEGATIVE.format(value=temp), param="temperature")
    checks = (
        ("top_p", lambda v: 0.0 < v <= 1.0, TOP_P), ("top_k", lambda v: v >= -1, TOP_K),
        ("min_p", lambda v: 0.0 <= v <= 1.0, MIN_P), ("max_tokens", lambda v: v >= 1, MAX_TOKENS),
        ("logprobs", lambda v: v >= -1, LOGPROBS), ("prompt_logprobs", lambda v: v >= -1, PROMPT_LOGPROBS),
    )
    for name, ok, text in checks:
        value = sp.get(name)
        if value is not None and not ok(value):
            return Violation(text.format(value=value), param=name)
    stop = sp.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in stops):
        return Violation(EMPTY_STOP, param="stop")
    if stops and sp.get("detokenize") is False:
        return Violation(STOP_NEEDS_DETOKENIZE, param="stop")
    return None


def logprob_ids_violation(ids: list[int] | None, logprobs: int | None, vocab: int) -> Violation | None:
    """vLLM's rules on logprob_token_ids: at most 128, in the vocabulary, and `logprobs` (if set) equals the count."""
    if ids is None:
        return None
    if len(ids) > MAX_LOGPROB_TOKEN_IDS:
        return Violation(IDS_TOO_MANY.format(n=len(ids), limit=MAX_LOGPROB_TOKEN_IDS), param="logprob_token_ids")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        return Violation(IDS_OUT_OF_VOCAB.format(bad=bad[:8], vocab=vocab), param="logprob_token_ids")
    if logprobs is not None and logprobs != len(ids):
        return Violation(IDS_COUNT.format(logprobs=logprobs, n=len(ids)), param="logprob_token_ids")
    return None


def rows_violation(rows: list[list[int]] | None, start: int | None, prompt_len: int, max_logprobs: int,
                   vocab: int) -> Violation | None:
    """vLLM's rules on prompt_logprob_token_ids and prompt_logprob_start, in its order."""
    param = "prompt_logprob_token_ids"
    if rows is None:
        return Violation(START_NEEDS_ROWS, param="prompt_logprob_start") if start is not None else None
    width = max(map(len, rows), default=0)
    if not rows or width == 0:
        return Violation(ROWS_SHAPE, param=param)
    if width > max_logprobs:
        return Violation(ROWS_WIDE.format(n=width, limit=max_logprobs), param=param)
    if any(not -1 <= t < vocab for row in rows for t in row):
        return Violation(ROWS_OUT_OF_VOCAB.format(vocab=vocab), param=param)
    if start is not None and start < 0:
        return Violation(START_NEGATIVE, param="prompt_logprob_start")
    scored = max(prompt_len - 1 - (start or 0), 0)
    if len(rows) != scored:
        return Violation(ROWS_COUNT.format(rows=len(rows), scored=scored), param=param)
    return None
