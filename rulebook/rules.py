"""The request rulebook: every rule a request's parameters must keep, with its one message, written once.

Pure (no torch, no Ray, no web framework; of ours only the protocol floor), so both sides call it: the ingress
before any work is queued (ingress/generate/validation.py, ingress/openai/validation.py, its other routes), and
the engine as its last line of defence (LLMEngine.add_request), with the same texts. Each check returns the broken
rule as a Violation, or None; the caller raises it as its own error type (the ingress's InvalidRequest,
the engine's RequestError) and decides where in its own order of rules the check runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.sampling import MIN_TEMPERATURE

# Torch generators take seeds in [0, 2**64); the bound also stops a 10**30 seed before it reaches a tensor.
MAX_SEED = 2**63 - 1

# A worker can send these back too: it checks a text prompt against the context length after tokenizing it,
# with this same text, as an error finish with code 400.
TOKEN_OUT_OF_RANGE = "Token id {token_id} is out of range for the vocabulary size {vocab_size}."
CONTEXT_TOO_LONG = (
    "The prompt length {prompt_len} plus max_tokens {max_tokens} exceeds the model's context length {context_len}."
)
NEGATIVE = "The {name} {value} must be non-negative."
KV_TOO_SMALL = ("The prompt length {prompt_len} plus max_tokens {max_tokens} does not fit the KV cache of {capacity} "
                "tokens.")
EMPTY_INPUT_IDS = "The input_ids must not be an empty list"
LOGPROBS_DISABLED = "return_logprob(True) requested but not enabled logprobs_mode in engine configuration."
START_PAST_END = ("logprob_start_len({start}) exceeds the last scorable source position for input_ids "
                  "length({num_ids}).")
NOTHING_TO_COMPUTE = "The max_tokens 0 must be a positive integer."
NEGATIVE_TOP_LOGPROBS = "The top_logprobs_num {k} cannot be a negative integer."
TEXT_TOO_LONG = ("The text has {chars} characters, above max_model_len x max_prompt_chars_per_token = {limit} "
                 "(config field `max_prompt_chars_per_token`): it cannot fit the model's context.")


TOO_MANY_IDS = ("The {param} list has {count} token ids, above max_model_len = {limit}: this server detokenizes at "
                "most one context's worth of ids per request.")
EMPTY_PROMPT = "The prompt must not be an empty string"
REQUEST_ID_IN_USE = "request id {rid!r} is already in use"

# The shape of a /generate body (ingress/generate/validation.py checks them in the contract's order); written here
# so that docs/api.md lists them and no second file retypes them.
TOP_K_NEEDS_LOGPROB = "top_logprobs_num requires return_logprob=True."
ONE_PROMPT_FORM = "You must specify exactly one of prompt or input_ids"
NO_IMAGES = "image input is not supported by this server."
START_NEEDS_RAW_MODE = "logprob_start_len requires raw_logits or raw_logprobs mode."
START_NEEDS_SCORING_ONLY = "logprob_start_len requires max_tokens=0."
START_NEEDS_IDS = "logprob_start_len requires input_ids."
# A /generate batch (a list of prompts or of id lists).
EMPTY_BATCH = "The prompt must not be an empty list"

@dataclass(frozen=True)
class Violation:
    """A broken rule: its message, and the request field it concerns (None: the request as a whole)."""

    message: str
    param: str | None = None


class Sampling(Protocol):
    """What the sampling rules read of a request (protocol/sampling.py's SamplingParams)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    top_logprobs_num: int
    input_logprob_temperature: float | None
    token_ids_logprob: list[int] | None
    token_id_rows: list[list[int]] | None
    logprob_start_len: int
    stop: list[str]
    stop_token_ids: list[int]


def empty_ids(ids: Sequence[int]) -> Violation | None:
    return Violation(EMPTY_INPUT_IDS) if not ids else None


def empty_prompt(ids_or_text: Sequence[int] | str) -> Violation | None:
    """A text prompt that is "" (the ingress) or that tokenizes to nothing (the worker)."""
    return Violation(EMPTY_PROMPT) if len(ids_or_text) == 0 else None


def request_id_in_use(rid: str, in_use: bool) -> Violation | None:
    """Two requests under one id would be one request to the engine (its outputs, its abort)."""
    return Violation(REQUEST_ID_IN_USE.format(rid=rid)) if in_use else None


def token_out_of_range(ids: Sequence[int], vocab_size: int) -> Violation | None:
    """The first id outside [0, vocab_size)."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    return None if bad is None else Violation(TOKEN_OUT_OF_RANGE.format(token_id=bad, vocab_size=vocab_size))


def kv_too_small(prompt_len: int, max_tokens: int, capacity: int, fits: bool) -> Violation | None:
    """A request the worker's whole KV cache (`capacity` tokens) could never hold: it would wait forever."""
    return None if fits else Violation(KV_TOO_SMALL.format(prompt_len=prompt_len, max_tokens=max_tokens,
                                                           capacity=capacity))


def negative_max_tokens(max_tokens: int) -> Violation | None:
    return negative("max_tokens", max_tokens)


def negative(name: str, value: int) -> Violation | None:
    """A count the request gives (max_tokens, OpenAI's logprobs / top_logprobs) below 0."""
    return Violation(NEGATIVE.format(name=name, value=value)) if value < 0 else None


def context_too_long(prompt_len: int, max_tokens: int, context_len: int) -> Violation | None:
    if prompt_len + max_tokens <= context_len:
        return None
    return Violation(CONTEXT_TOO_LONG.format(prompt_len=prompt_len, max_tokens=max_tokens, context_len=context_len))


def logprobs_disabled(return_logprob: bool, logprobs_mode: str) -> Violation | None:
    return Violation(LOGPROBS_DISABLED) if return_logprob and logprobs_mode == "none" else None


def start_past_end(start: int, num_ids: int) -> Violation | None:
    """Scoring rows score ids[start+1:], so at least one id must follow the boundary."""
    return Violation(START_PAST_END.format(start=start, num_ids=num_ids)) if start + 1 >= num_ids else None


def nothing_to_compute(max_tokens: int, scores_input: bool) -> Violation | None:
    """Without a scoring boundary, max_tokens=0 would compute nothing."""
    return Violation(NOTHING_TO_COMPUTE) if max_tokens == 0 and not scores_input else None


# The request ids of one HTTP request, and the boundary's own precondition: both /generate shapes ask them.
RID_NOT_STRING = "The rid must be a string for a single prompt."
RID_PER_ITEM = "The rid of a batch must be a list of {n} strings, one per item."
RID_REPEATED = "The rid of a batch must not repeat an id: each item is its own request."
START_NEEDS_LOGPROB = "logprob_start_len requires return_logprob=True."
ITEM = "Item {i}: {message}"

NOT_TEXT = "The {what} is not valid text: it holds a lone UTF-16 surrogate ({char!r})."


def not_text(text: str, what: str = "prompt") -> Violation | None:
    """JSON lets a client send a lone surrogate ("\\ud800"); no tokenizer can encode it (a TypeError, a 5xx)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return Violation(NOT_TEXT.format(what=what, char=text[exc.start]))
    return None


def text_too_long(chars: int, max_model_len: int, chars_per_token: int) -> Violation | None:
    """A text is bounded before it is tokenized (tokenizing megabytes holds a worker for seconds): no prompt of
    more than chars_per_token characters per token of the context can fit it."""
    limit = max_model_len * chars_per_token
    return Violation(TEXT_TOO_LONG.format(chars=chars, limit=limit)) if chars > limit else None


def too_many_ids(count: int, max_model_len: int, param: str = "tokens") -> Violation | None:
    """Ids to detokenize are bounded by the context before any is looked at (1.9 M ids held a worker and came back
    as a 503, which a retry never fixes)."""
    if count <= max_model_len:
        return None
    return Violation(TOO_MANY_IDS.format(param=param, count=count, limit=max_model_len), param)


def untokenizable(text: str, max_model_len: int, chars_per_token: int, what: str = "prompt") -> Violation | None:
    """The checks every text gets before a tokenizer sees it (the ingress's routes and the worker alike)."""
    return text_too_long(len(text), max_model_len, chars_per_token) or not_text(text, what)


def negative_top_logprobs(k: int) -> Violation | None:
    return Violation(NEGATIVE_TOP_LOGPROBS.format(k=k)) if k < 0 else None


# Below this, a sampling temperature is greedy (vLLM's and SGLang's threshold) and a scoring temperature is refused:
# logits / T in float32 overflows to inf for a subnormal or underflowed T (1e-40 is subnormal, 1e-300 rounds to 0),
# and the softmax of inf is NaN, which the sampler would turn into token id 0.
SCORING_TEMPERATURE = ("The input_logprob_temperature {value} must be finite and at least " + repr(MIN_TEMPERATURE)
                       + " (below, logits / T overflows float32).")
NEEDS_INPUT_SCORING = ("The {name} applies to input-token scoring rows only: it requires logprob_start_len >= 0 "
                       "(and max_tokens=0).")


def input_logprob_temperature(temp: float | None) -> Violation | None:
    """log_softmax(logits / T) needs MIN_TEMPERATURE <= T < inf (NaN fails the comparison too); None = not asked."""
    ok = temp is None or MIN_TEMPERATURE <= temp < float("inf")
    return None if ok else Violation(SCORING_TEMPERATURE.format(value=temp), param="input_logprob_temperature")


def needs_input_scoring(temp: float | None, token_ids: Sequence[Any] | None) -> Violation | None:
    """The scoring fields on a request that scores no input: they would be silently ignored."""
    for name, value in (("input_logprob_temperature", temp), ("token_ids_logprob", token_ids)):
        if value is not None:
            return Violation(NEEDS_INPUT_SCORING.format(name=name), param=name)
    return None


TOKEN_ID_ROWS = ("The token_ids_logprob has {lists} lists, one per scored row, but the request scores {rows} rows "
                 "(input_ids[{first}:], logprob_start_len {start} + 1 onwards).")
TOKEN_ID_LISTS_MIXED = "The token_ids_logprob must be a list of token ids or a list of lists of them, not a mix."
TOKEN_ID_COUNT = "The token ids have {lists} lists, one per scored token, but {rows} tokens are scored."


def token_id_count(token_ids: Sequence[Any] | None, rows: int) -> Violation | None:
    """The same rule where the scored rows are not one request's (offline rows split into windows): a flat list
    applies to every row, a list of lists needs one per scored row."""
    if not token_ids:
        return None
    nested = [isinstance(row, list) for row in token_ids]
    if any(nested) and not all(nested):
        return Violation(TOKEN_ID_LISTS_MIXED, param="token_ids_logprob")
    if all(nested) and len(token_ids) != rows:
        return Violation(TOKEN_ID_COUNT.format(lists=len(token_ids), rows=rows), param="token_ids_logprob")
    return None


def token_id_shapes_mixed(token_ids: Sequence[Any] | None) -> Violation | None:
    """Candidate ids are a list of ids or a list of lists of them; a body's list that mixes the two has no meaning
    (checked where a dialect parses its body, before the canonical request splits the two shapes)."""
    nested = [isinstance(row, list) for row in token_ids or ()]
    return Violation(TOKEN_ID_LISTS_MIXED, param="token_ids_logprob") if any(nested) and not all(nested) else None


def token_id_rows(token_ids: Sequence[Any] | None, start: int, num_ids: int) -> Violation | None:
    """Per-row candidate ids (a list of lists) need exactly one list per scored row, input_ids[start+1:]; a flat
    list applies to every row."""
    if not token_ids:
        return None
    nested = [isinstance(row, list) for row in token_ids]
    if any(nested) and not all(nested):
        return Violation(TOKEN_ID_LISTS_MIXED, param="token_ids_logprob")
    rows = max(0, num_ids - start - 1)
    if all(nested) and len(token_ids) != rows:
        return Violation(TOKEN_ID_ROWS.format(lists=len(token_ids), rows=rows, first=start + 1, start=start),
                         param="token_ids_logprob")
    return None


def flat(values: Sequence[Any]) -> list[Any]:
    """A list field's entries, a list of lists (per-row token ids) read row by row."""
    return [x for v in values for x in (v if isinstance(v, list) else (v,))]


@dataclass(frozen=True)
class SamplingRule:
    """`ok(value, vocab_size)` must hold for the field (for each entry of a list field, with `each`);
    otherwise the request is a 400 whose message is `text` with {value} (the offending value) and {vocab}."""

    field: str
    ok: Callable[[Any, int], bool]
    text: str
    each: bool = False
    # The request field the client named, when the canonical request splits it (token_ids_logprob's two shapes).
    param: str | None = None


# In the order they are checked (first failure wins). Upper bounds on integers matter as much as lower
# ones: a 10**30 that reached a torch call would be a 5xx, and nothing a client sends may be.
TOKEN_ID_RANGE = "The token_ids_logprob entry {value} is out of range for the vocabulary size {vocab}."
SAMPLING_RULES: tuple[SamplingRule, ...] = (
    # Any T below MIN_TEMPERATURE is greedy (SamplingParams.greedy); an infinite one has no distribution.
    SamplingRule("temperature", lambda x, v: 0 <= x < float("inf"),
                 "The temperature {value} must be non-negative and finite."),
    SamplingRule("top_p", lambda x, v: 0 < x <= 1, "The top_p {value} must be in (0, 1]."),
    SamplingRule("top_k", lambda x, v: -1 <= x <= v,
                 "The top_k {value} must be -1 (disabled) or at most the vocabulary size {vocab}."),
    SamplingRule("min_p", lambda x, v: 0 <= x <= 1, "The min_p {value} must be in [0, 1]."),
    SamplingRule("seed", lambda x, v: x is None or 0 <= x <= MAX_SEED,
                 "The seed {value} must be in [0, " + str(MAX_SEED) + "]."),
    SamplingRule("top_logprobs_num", lambda x, v: x <= v,
                 "The top_logprobs_num {value} exceeds the vocabulary size {vocab}."),
    # Scoring rows are log_softmax(logits / T): a tiny T or an infinite one has no float32 distribution (NaN rows),
    # so the rule is [MIN_TEMPERATURE, inf); None = not asked (1.0).
    SamplingRule("input_logprob_temperature", lambda x, v: input_logprob_temperature(x) is None, SCORING_TEMPERATURE),
    SamplingRule("token_ids_logprob", lambda x, v: 0 <= x < v, TOKEN_ID_RANGE, each=True),
    SamplingRule("token_id_rows", lambda x, v: 0 <= x < v, TOKEN_ID_RANGE, each=True, param="token_ids_logprob"),
    # An empty stop string would match at every position and end generation at once.
    SamplingRule("stop", lambda x, v: x != "", "The stop strings must not be empty.", each=True),
    SamplingRule("stop_token_ids", lambda x, v: 0 <= x < v,
                 "The stop_token_ids entry {value} is out of range for the vocabulary size {vocab}.", each=True),
)


def sampling_violation(params: Sampling, vocab_size: int) -> Violation | None:
    """The first sampling rule `params` breaks (`param` = the field)."""
    for rule in SAMPLING_RULES:
        value = getattr(params, rule.field)
        for item in flat(value or ()) if rule.each else (value,):
            if not rule.ok(item, vocab_size):
                return Violation(rule.text.format(value=item, vocab=vocab_size), param=rule.param or rule.field)
    return None
