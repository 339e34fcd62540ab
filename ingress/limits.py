"""What one request may ask the workers for, checked on its worker requests before any is sent.

Every route builds GenerateRequest carriers, and the lifecycle checks them here as it opens them
(`Exchange.open`), so a route added later gets the limits for free. A request over a limit is a 400 whose
message (rulebook/limits.py) names the limit and the config field that raises it. The body's size (413) is
checked earlier, on the raw bytes (edge/middleware.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from ingress.errors import enforce
from ingress.settings import IngressSettings
from protocol import GenerateRequest, ModelInfo, SamplingParams
from rulebook import limits


def logprob_entries(req: GenerateRequest) -> int:
    """[value, token_id] entries the request's answer holds at most: the engine's count (SamplingParams), none
    without return_logprob."""
    if not req.params.return_logprob:
        return 0
    return req.params.logprob_entries(len(req.input_ids))


def check_limits(requests: Sequence[GenerateRequest], settings: IngressSettings, info: ModelInfo | None = None,
                 param: str | None = None) -> None:
    """Raise InvalidRequest (400) when the worker requests of one HTTP request exceed a limit. The logprob limits are
    the workers' (`info`: their runtime settings, changed by their user_config) where it carries them, else the
    settings'. param: the body's field that asked for the logprobs (a route that knows it checks first, so that its
    400 names the field)."""
    check_fan_out(len(requests), settings)
    top = info.max_top_logprobs if info is not None and info.max_top_logprobs is not None else settings.max_top_logprobs
    entries = (info.max_logprob_entries if info is not None and info.max_logprob_entries is not None
               else settings.max_logprob_entries)
    for req in requests:
        check_fields(req, settings)
        enforce(limits.top_logprobs_over(req.params.top_logprobs_num, top), param=param)
    enforce(limits.entries_over(sum(logprob_entries(req) for req in requests), entries), param=param)


def check_fan_out(n: int, settings: IngressSettings) -> None:
    """The fan-out bound alone, for a route that can count its worker requests from the body before any worker call
    (tokenizing /v1/score's 300 text items is 300 texts of worker time, and then the request is refused anyway)."""
    enforce(limits.fan_out_over(n, settings.max_batch_items))


def check_fields(req: GenerateRequest, settings: IngressSettings) -> None:
    """The bounds on a request's lists and strings that the engine would otherwise scan or copy per token."""
    p = req.params
    bounds = (("number of stop strings", len(p.stop), settings.max_stop_strings, "max_stop_strings"),
              ("longest stop string", max(map(len, p.stop), default=0), settings.max_stop_string_chars,
               "max_stop_string_chars"),
              ("number of stop_token_ids", len(p.stop_token_ids), settings.max_stop_token_ids, "max_stop_token_ids"),
              ("number of token_ids_logprob", _token_ids_width(p), settings.max_token_ids_logprob,
               "max_token_ids_logprob"),
              ("request id length", len(req.rid), settings.max_rid_chars, "max_rid_chars"))
    for what, n, limit, name in bounds:
        enforce(limits.field_over(what, n, limit, name))


def _token_ids_width(p: SamplingParams) -> int:
    """Token ids asked at one position: the flat list's length, or the longest row's with per-row lists."""
    if p.token_id_rows:
        return max(len(row) for row in p.token_id_rows)
    return len(p.token_ids_logprob or ())
