"""Fields a dialect knows and does not implement: one table per dialect, one check and one message for all of them.

A field that changes what is computed and is not honoured is a 400 naming it, never silently dropped: a client that
asks for a repetition penalty must not get an answer without one and believe it has it. Such a field is accepted only
at a neutral value, one that computes nothing different (TRL sends `repetition_penalty: 1.0` on every generation).
Each dialect lists its refused fields with why and their neutral values: the OpenAI routes (openai_fields.py),
SGLang's /generate and /update_weights_from_disk (sglang.py), vLLM's token-in route (vllm_generate.py) and the seed's
/generate (generate_fields.py); each decides which of a body's fields it looks up, and `refusal` judges them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rulebook.images import quote
from rulebook.rules import Violation

REFUSED = "`{name}`={value} is not supported by this server: {why}. Only {neutral} is accepted ({doc})."


class Why:
    """Why a field is refused, where several dialects refuse one for the same reason (the `{why}` of REFUSED)."""

    PENALTY = "penalties are not implemented"
    GRAMMAR = "constrained decoding is not implemented"
    MIN_LENGTH = "a minimum length is not implemented"
    LOGIT_BIAS = "logit biases are not implemented"
    LOGIT_PROCESSORS = "custom logit processors are not implemented"
    REASONING = "reasoning controls are not implemented"
    NOT_PARSED = "reasoning is not parsed"
    HIDDEN_STATES = "hidden states are not returned"
    ROUTED_EXPERTS = "routed experts are not returned"
    SESSIONS = "sessions are not implemented"
    DISAGGREGATION = "disaggregated serving is not implemented"
    EXTENSIONS = "custom extensions are not implemented"
    ARRIVAL_ORDER = "requests are served in arrival order"
    SHARED_CACHE = "the prefix cache is shared by every request of a deployment"
    EVERY_TOKEN = "a stream sends an event for every token"
    ONE_CHOICE = "one choice per prompt"
    IDS_OR_TEXT = "prompts are text or token ids"
    DEFAULT_SPACING = "detokenization keeps the tokenizer's default"


@dataclass(frozen=True)
class Refused:
    """A known field this server does not implement: why, and the values it is accepted at (null always is)."""

    why: str
    neutral: tuple[Any, ...] = ()


def is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """A field's value that computes nothing different: None, or equal to one of `neutral` as the same kind of
    value (a bool only to a bool, True is not 1; a number to any number, 1 is 1.0; anything else to its own type)."""
    if value is None:
        return True
    for v in neutral:
        if isinstance(value, bool) or isinstance(v, bool):
            if type(value) is type(v) and value == v:
                return True
        elif isinstance(value, (int, float)) and isinstance(v, (int, float)):
            if value == v:
                return True
        elif type(value) is type(v) and value == v:
            return True
    return False


def neutral_text(neutral: tuple[Any, ...]) -> str:
    return " or ".join(["null", *(repr(v) for v in neutral if v is not None)])


def refusal(name: str, value: Any, rule: Refused, doc: str) -> Violation | None:
    """The refused field `name` (its path in the body: `sampling_params.n`) at `value`: None when neutral, else the
    400 naming it, quoting at most a short prefix of the value; `doc`: the page that lists the dialect's fields."""
    if is_neutral(value, rule.neutral):
        return None
    return Violation(REFUSED.format(name=name, value=quote(repr(value)), why=rule.why,
                                    neutral=neutral_text(rule.neutral), doc=doc), param=name)


def first_refusal(fields: Mapping[str, Any], table: Mapping[str, Refused], doc: str) -> Violation | None:
    """The first field of `table` (in its order) that `fields` holds at a value it refuses."""
    for name, rule in table.items():
        if name in fields and (broken := refusal(name, fields[name], rule, doc)) is not None:
            return broken
    return None
