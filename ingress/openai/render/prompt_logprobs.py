"""vLLM's `prompt_logprobs`: per prompt position, null at position 0 (nothing predicts the first token), then a dict
from token id (a string, as JSON writes vLLM's int keys) to `{logprob, rank, decoded_token}`.

As vLLM builds it: the prompt token first, always present with its true rank (how many tokens have a logprob >= its
own, from the engine's `return_input_ranks`), then the k most likely tokens with ranks 1..k; a token that is both keeps
its first entry (the same value). -inf is written as -9999.0, vLLM's clamp. `decoded_token` is the token decoded alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol import RequestOutput, compact

LogprobEntry = dict[str, Any]
# vLLM's stand-in for -inf, which JSON cannot write.
FLOOR = -9999.0


def _value(v: float) -> float:
    return FLOOR if v == float("-inf") else v


def prompt_logprobs_ids(chunk: RequestOutput, k: int) -> set[int]:
    """The ids whose text `prompt_logprobs_json` looks up."""
    ids = {t for _, t in chunk.input_token_logprobs or ()}
    for row in chunk.input_top_logprobs or ():
        ids.update(t for _, t in row[:k])
    return ids


def prompt_logprobs_json(chunk: RequestOutput, k: int, texts: Mapping[int, str]
                         ) -> list[dict[str, LogprobEntry] | None]:
    """The answer's `prompt_logprobs` from a whole (merged) chunk whose request scored its prompt from position 0
    with ranks and at least k alternatives per row (the worker's top-k may be wider: another field asked more)."""
    rows = chunk.input_token_logprobs or []
    tops = chunk.input_top_logprobs or []
    ranks = chunk.input_token_ranks or []
    out: list[dict[str, LogprobEntry] | None] = [None]
    for j, (value, token) in enumerate(rows):
        entry = {str(token): {"logprob": _value(value), "rank": ranks[j], "decoded_token": texts[token]}}
        for place, (tv, tt) in enumerate(tops[j][:k] if j < len(tops) else (), start=1):
            entry.setdefault(str(tt), {"logprob": _value(tv), "rank": place, "decoded_token": texts[tt]})
        out.append(entry)
    return out


def prompt_logprobs_flat(chunk: RequestOutput, k: int) -> dict[str, Any]:
    """The same rows in the compact encoding (protocol/compact.py): the prompt tokens' values, ids and ranks [n] and the
    k most likely tokens [n, k], each with null_prefix 1 (position 0)."""
    return {**compact.encode_token_rows("prompt_logprobs", chunk.input_token_logprobs or [], null_prefix=1),
            **compact.flat_ids("prompt_logprobs", chunk.input_token_ranks or [], suffix="rank"),
            **compact.encode_top_rows("prompt_top_logprobs", [r[:k] for r in chunk.input_top_logprobs or []],
                                      null_prefix=1)}
