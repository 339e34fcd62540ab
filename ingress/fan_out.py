"""The worker requests of one HTTP request, admitted as one unit.

A /generate batch, the prompts of /v1/completions and /v1/score's items become several worker requests.
Counted one by one, their prompts overflow a worker's queue bounds even on an idle server (40 labels of an
1,800-token query are 72,000 queued tokens, against max_queued_tokens=32,768), and each refusal is a 503 that
invites a retry which can never work. So before any is sent:
- each request is tagged with the HTTP request's group and with how many of its first tokens an earlier request of
  the group has too (the shared query, the item before its label): the worker's queue counts those once
  (engine/core/admission.py), as its prefix cache computes them once;
- a group whose count exceeds what an idle worker queues (max_queued_requests, max_queued_tokens) is refused
  here with 400 naming both fields: it can never be admitted as it is, only split.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

from ingress.errors import InvalidRequest
from protocol import GenerateRequest, ModelInfo

NEVER_FITS = ("The request makes {n} worker requests of {tokens} prompt tokens (counting the prefixes they share "
              "once); a worker queues at most {max_requests} requests (config field `max_queued_requests`) and "
              "{max_tokens} prompt tokens (config field `max_queued_tokens`), so it can never be admitted: split it.")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: a binary search over slice comparisons (each one in C), so a pair of
    8,000-token prompts costs a few dozen comparisons of slices rather than a Python loop over tokens."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def as_one_unit(requests: Sequence[GenerateRequest], info: ModelInfo) -> list[GenerateRequest]:
    """The requests tagged with one group and their shared tokens; InvalidRequest (400) when an idle worker could
    never queue them all. A lone request is left as it is: an empty worker queue takes any prompt."""
    if len(requests) < 2:
        return list(requests)
    group = uuid.uuid4().hex
    tagged: list[GenerateRequest] = []
    tokens = 0
    for i, req in enumerate(requests):
        ids = req.input_ids
        shared = max((common_prefix(ids, earlier.input_ids) for earlier in requests[:i]), default=0)
        tokens += len(ids) - shared
        tagged.append(replace(req, group=group, shared_tokens=shared))
    too_many = info.max_queued_requests is not None and len(requests) > info.max_queued_requests
    too_long = info.max_queued_tokens is not None and tokens > info.max_queued_tokens
    if too_many or too_long:
        raise InvalidRequest(NEVER_FITS.format(n=len(requests), tokens=tokens, max_requests=info.max_queued_requests,
                                               max_tokens=info.max_queued_tokens))
    return tagged
