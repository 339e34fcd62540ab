"""What the engine hands back for a request, and what crosses the worker -> ingress boundary as is: deltas, where
None = not requested and [] = requested, empty."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

FinishType = Literal["stop", "length", "abort", "error"]

# The name of the weights an engine starts with, until an update names others (SGLang's default).
DEFAULT_WEIGHT_VERSION = "default"

# [value, token_id]
TokenLogprob = tuple[float, int]

# Field metadata of a RequestOutput's field: it holds only what is new since the previous delta, so a stream's
# deltas concatenate. Every other field holds a running value (totals, the finish, timings) that the latest delta
# carries.
CONCAT = {"concat": True}

D = TypeVar("D")


@dataclass
class FinishReason:
    type: FinishType
    # The stop string or stop token id that ended generation, when there is one.
    matched: str | int | None = None
    message: str | None = None
    # With type "error": 400 when the request itself was bad (the caller's fault), 500 when the engine failed.
    code: int | None = None


@dataclass
class RequestOutput:
    """One delta of a request's stream. Only what is new since the previous delta.

    The one output type from the engine to the HTTP answer: the engine builds it, the worker adds what only it
    knows (the versions; the echo of input_logprob_temperature) to the same object in the engine thread, Serve
    pickles it, and the ingress writes `text` (ingress/output/). Plain builtins: no tensors, no engine state.
    Logprob lists are None when the request did not ask for them and a (possibly empty) list when it did; their
    rows are the engine's own (value, token_id) tuples, never copied on the way.
    The last delta has finished=True; nothing follows it, and it never replays an earlier delta.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list, metadata=CONCAT)
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # running total
    cached_tokens: int = 0
    input_token_logprobs: list[TokenLogprob] | None = field(default=None, metadata=CONCAT)
    input_top_logprobs: list[list[TokenLogprob]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, the values of the request's token_ids_logprob, in the order asked.
    input_token_ids_logprobs: list[list[TokenLogprob]] | None = field(default=None, metadata=CONCAT)
    # Per scored input position, its token's rank in the row (return_input_ranks).
    input_token_ranks: list[int] | None = field(default=None, metadata=CONCAT)
    output_token_logprobs: list[TokenLogprob] | None = field(default=None, metadata=CONCAT)
    output_top_logprobs: list[list[TokenLogprob]] | None = field(default=None, metadata=CONCAT)
    # A classify request's raw scores (float32) at its pooled position: [num_labels], on its final delta only.
    pooled: list[float] | None = None
    # Per generated token, the values of the request's (flat) token_ids_logprob at its position.
    output_token_ids_logprobs: list[list[TokenLogprob]] | None = field(default=None, metadata=CONCAT)
    # Per generated token, its rank in the row it was sampled from (return_output_ranks).
    output_token_ranks: list[int] | None = field(default=None, metadata=CONCAT)
    # Timings (time.monotonic seconds): arrival, first scheduled, finished.
    arrival_time: float | None = None
    scheduled_time: float | None = None
    finished_time: float | None = None
    # The generated text: the engine and the worker leave it empty (they return ids and logprobs); the ingress
    # writes it from new_token_ids with its own tokenizer, stop strings matched (ingress/output/).
    text: str = field(default="", metadata=CONCAT)
    # The request's input_logprob_temperature, echoed (set by the worker); None when it did not set one.
    input_logprob_temperature: float | None = None
    # The weights the request ran on (set by the worker; every delta of a request carries the same: weights change
    # between requests).
    weight_version: str | None = None
    # The worker's ModelInfo.version when the request started: the ingress refreshes its copy when it differs.
    info_version: str | None = None

    def __reduce__(self) -> tuple[type[RequestOutput], tuple[Any, ...]]:
        # Pickled as its values in field order, without the field names a dataclass's state would repeat in every
        # delta: one crosses the worker -> ingress boundary per generated token.
        return RequestOutput, _values(self)


_values = operator.attrgetter(*(f.name for f in fields(RequestOutput)))


def merge_outputs(deltas: Sequence[D]) -> D:
    """Concatenate a stream's deltas into the whole answer (what a non-streaming caller gets).

    The one merge of every delta type (engine outputs, the worker's carriers): fields marked CONCAT
    concatenate, and a logprob list stays None until some delta brings one, so None vs [] survives; every
    other field takes the latest value a delta has (not None).
    """
    if not deltas:
        raise ValueError("no outputs to merge")
    merged: dict[str, Any] = {}
    for delta in deltas:
        # D is bound to no dataclass protocol, so mypy cannot see that every delta is a dataclass instance.
        for f in fields(delta):  # type: ignore[arg-type]
            new = getattr(delta, f.name)
            old = merged.get(f.name)
            if f.metadata.get("concat") and new is not None:
                # new[:0]: an empty str or list, so the merged value never aliases a delta's own list.
                merged[f.name] = (new[:0] if old is None else old) + new
            elif new is not None or f.name not in merged:
                merged[f.name] = new
    return type(deltas[0])(**merged)
