"""The rules both APIs apply to a request's SamplingParams, and the texts they share: one table, one wording.

/generate (generate/validation.py) and /v1/completions (openai/validation.py) build the same SamplingParams and check
them here, so a value out of range gets the same message whichever API it came through; each API only
decides where in its own order of rules these run, and how its error body looks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ingress.errors import InvalidRequest
from workers.protocol import SamplingParams

# Torch generators take seeds in [0, 2**64); the bound also stops a 10**30 seed before it reaches a tensor.
MAX_SEED = 2**63 - 1

# Texts a worker can send back too: the engine checks a text prompt against the context length after
# tokenizing it, with this same text, as an error finish with code 400.
TOKEN_OUT_OF_RANGE = "Token id {token_id} is out of range for the vocabulary size {vocab_size}."
CONTEXT_TOO_LONG = (
    "The prompt length {prompt_len} plus max_tokens {max_tokens} exceeds the model's context length {context_len}."
)
MAX_TOKENS_NEGATIVE = "The max_tokens {max_tokens} must be non-negative."


@dataclass(frozen=True)
class SamplingRule:
    """`ok(value, vocab_size)` must hold for the field (for each entry of a list field, with `each`);
    otherwise the request is a 400 whose message is `text` with {value} (the offending value) and {vocab}."""

    field: str
    ok: Callable[[Any, int], bool]
    text: str
    each: bool = False


# In the order they are checked (first failure wins). Upper bounds on integers matter as much as lower
# ones: a 10**30 that reached a torch call would be a 5xx, and nothing a client sends may be.
SAMPLING_RULES: tuple[SamplingRule, ...] = (
    SamplingRule("temperature", lambda x, v: x >= 0, "The temperature {value} must be non-negative."),
    SamplingRule("top_p", lambda x, v: 0 < x <= 1, "The top_p {value} must be in (0, 1]."),
    SamplingRule("top_k", lambda x, v: -1 <= x <= v,
                 "The top_k {value} must be -1 (disabled) or at most the vocabulary size {vocab}."),
    SamplingRule("min_p", lambda x, v: 0 <= x <= 1, "The min_p {value} must be in [0, 1]."),
    SamplingRule("seed", lambda x, v: x is None or 0 <= x <= MAX_SEED,
                 "The seed {value} must be in [0, " + str(MAX_SEED) + "]."),
    SamplingRule("top_logprobs_num", lambda x, v: x <= v,
                 "The top_logprobs_num {value} exceeds the vocabulary size {vocab}."),
    # An empty stop string would match at every position and end generation at once.
    SamplingRule("stop", lambda x, v: x != "", "The stop strings must not be empty.", each=True),
    SamplingRule("stop_token_ids", lambda x, v: 0 <= x < v,
                 "The stop_token_ids entry {value} is out of range for the vocabulary size {vocab}.", each=True),
)


def check_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Raise InvalidRequest (`param` = the field) for the first rule `params` breaks."""
    for rule in SAMPLING_RULES:
        value = getattr(params, rule.field)
        for item in value if rule.each else (value,):
            if not rule.ok(item, vocab_size):
                raise InvalidRequest(rule.text.format(value=item, vocab=vocab_size), param=rule.field)
