"""What one request may ask the workers for, checked on its worker requests before any is sent.

Every route builds GenerateRequest carriers, and the lifecycle checks them here as it opens them
(`Batch.open`), so a route added later gets the limits for free. A request over a limit is a 400 whose
message names the limit and the config field that raises it. The body's size (413) is checked earlier, on
the raw bytes (edge/middleware.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from ingress.errors import InvalidRequest
from ingress.settings import IngressSettings
from workers.protocol import GenerateRequest

TOP_K_OVER = ("The request asks for the {k} most likely tokens per position; this server returns at most {limit} "
              "(config field `max_top_logprobs`).")
ENTRIES_OVER = ("The request would return {entries} logprob entries (rows x (1 + top-k) + scored rows x "
                "len(token_ids_logprob), summed over its prompts); "
                "this server returns at most {limit} per request (config field `max_logprob_entries`).")

FAN_OUT_OVER = ("The request makes {n} worker requests (batch items, prompts, or score items x labels); this "
                "server takes at most {limit} per request (config field `max_batch_items`).")
FIELD_OVER = "The request's {what} is {n}, above {limit} (config field `{field}`)."


def logprob_entries(req: GenerateRequest) -> int:
    """[value, token_id] entries the request's answer holds at most: the engine's count (SamplingParams), none
    without return_logprob. A text prompt is never scored (scoring needs ids), so it counts no prompt rows."""
    if not req.params.return_logprob:
        return 0
    return req.params.logprob_entries(len(req.input_ids) if req.input_ids is not None else 0)


def check_limits(requests: Sequence[GenerateRequest], settings: IngressSettings) -> None:
    """Raise InvalidRequest (400) when the worker requests of one HTTP request exceed a limit."""
    if len(requests) > settings.max_batch_items:
        raise InvalidRequest(FAN_OUT_OVER.format(n=len(requests), limit=settings.max_batch_items))
    for req in requests:
        check_fields(req, settings)
        k = req.params.top_logprobs_num
        if k > settings.max_top_logprobs:
            raise InvalidRequest(TOP_K_OVER.format(k=k, limit=settings.max_top_logprobs))
    entries = sum(logprob_entries(req) for req in requests)
    if entries > settings.max_logprob_entries:
        raise InvalidRequest(ENTRIES_OVER.format(entries=entries, limit=settings.max_logprob_entries))


def check_fields(req: GenerateRequest, settings: IngressSettings) -> None:
    """The bounds on a request's lists and strings that the engine would otherwise scan or copy per token."""
    p = req.params
    bounds = (("number of stop strings", len(p.stop), settings.max_stop_strings, "max_stop_strings"),
              ("longest stop string", max(map(len, p.stop), default=0), settings.max_stop_string_chars,
               "max_stop_string_chars"),
              ("number of stop_token_ids", len(p.stop_token_ids), settings.max_stop_token_ids, "max_stop_token_ids"),
              ("number of token_ids_logprob", _token_ids_width(p.token_ids_logprob), settings.max_token_ids_logprob,
               "max_token_ids_logprob"),
              ("request id length", len(req.rid), settings.max_rid_chars, "max_rid_chars"))
    for what, n, limit, name in bounds:
        if n > limit:
            raise InvalidRequest(FIELD_OVER.format(what=what, n=n, limit=limit, field=name))


def _token_ids_width(ids: list[int] | list[list[int]] | None) -> int:
    """Token ids asked at one position: the list's length, or the longest row's with per-row lists."""
    if not ids:
        return 0
    return max(len(row) for row in ids) if isinstance(ids[0], list) else len(ids)  # type: ignore[arg-type]
