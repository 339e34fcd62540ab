"""The limits both sides enforce, their defaults and their messages, stated once: the ingress checks them on an
HTTP request's worker requests before any is sent (ingress/limits.py), the engine on each request it is given
(its last line of defence, LLMEngine.add_request). The figures behind the defaults are bench/features/limits.py's
(docs/performance.md)."""

from __future__ import annotations

from rulebook.rules import Violation

# Largest top_logprobs_num (OpenAI `logprobs`) a request may ask.
MAX_TOP_LOGPROBS = 100
# Most [value, token_id] entries one answer may hold: rows x (1 + top-k); 2,000 rows x (1 + 100) fit.
MAX_LOGPROB_ENTRIES = 204_800

TOP_K_OVER = ("The request asks for the {k} most likely tokens per position; this server returns at most {limit} "
              "(config field `max_top_logprobs`).")
ENTRIES_OVER = ("The request would return {entries} logprob entries (rows x (1 + top-k) + scored rows x "
                "len(token_ids_logprob), summed over its prompts); "
                "this server returns at most {limit} per request (config field `max_logprob_entries`).")
FAN_OUT_OVER = ("The request makes {n} worker requests (batch items, prompts, or score items); this "
                "server takes at most {limit} per request (config field `max_batch_items`).")
FIELD_OVER = "The request's {what} is {n}, above {limit} (config field `{field}`)."


def top_logprobs_over(k: int, limit: int) -> Violation | None:
    return Violation(TOP_K_OVER.format(k=k, limit=limit)) if k > limit else None


def entries_over(entries: int, limit: int) -> Violation | None:
    """`entries`: SamplingParams.logprob_entries, summed over the prompts of one HTTP request at the ingress."""
    return Violation(ENTRIES_OVER.format(entries=entries, limit=limit)) if entries > limit else None


def fan_out_over(n: int, limit: int) -> Violation | None:
    return Violation(FAN_OUT_OVER.format(n=n, limit=limit)) if n > limit else None


def field_over(what: str, n: int, limit: int, field: str) -> Violation | None:
    """A list or string of the request longer than the config field `field` allows."""
    return Violation(FIELD_OVER.format(what=what, n=n, limit=limit, field=field), param=None) if n > limit else None
