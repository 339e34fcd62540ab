"""One HTTP request, one worker call, as Serve itself counts them: on the session's real cluster, Serve's request
counter of the EngineWorker deployment (read from Ray's Prometheus page, checks/serve_calls.py) against Serve's
proxy's count of HTTP requests, route by route, for issue 41's four routes: text completions with echo and
logprobs (8 prompts a request), streamed chat completions of 32 tokens, SGLang text /generate and /v1/score, and
a streamed completion of 4 text prompts (one generate_many call). Every worker call counts, the ingress's own
included: its copy of the model info is confirmed by the version each answer carries, so it makes no call of its
own while answers come.

The requests go one at a time, so the ingress never coalesces two into one call (which would read below 1)."""

from __future__ import annotations

import httpx
import pytest

from checks import serve_calls
from tests.helpers.serve import ids_of, shared_app, shared_name

# The session's shared one-worker app (tests/helpers/serve.py: shared_app): the counts are read before and after
# this module's own requests.
APP = shared_name(num_workers=1)
REQUESTS = 8  # per route: one extra call in all would read 1.125
TEXT = ("The committee met on a grey morning to settle the budget for the new library, and after two hours of "
        "argument about the roof they agreed to ask the town for more time.")


@pytest.fixture(scope="module")
def url(serve_url: str):
    return shared_app(serve_url, num_workers=1)


def test_serve_counts_one_worker_call_per_http_request(url: str, metrics_url: str) -> None:
    interval = serve_calls.report_interval_s()
    with httpx.Client(timeout=120) as client:
        model = client.get(url + "/v1/models").json()["data"][0]["id"]
        bodies = {name: serve_calls.routes(model, TEXT, ids_of(48, 5))[name]
                  for name in (*serve_calls.BOUND, serve_calls.STREAMED_MANY)}
        for path, body in bodies.values():  # warm-up: the ingress's first model info and its tokenizer
            serve_calls.post(client, url + path, body)
        before = serve_calls.settled(metrics_url, APP, interval)
        assert before.request_calls > 0 and before.http_requests >= len(bodies), before  # the counters count
        per_request: dict[str, float] = {}
        for name, (path, body) in bodies.items():
            for _ in range(REQUESTS):
                serve_calls.post(client, url + path, body)
            after = serve_calls.settled(metrics_url, APP, interval, before.http_requests + REQUESTS)
            got = after.minus(before)
            assert got.http_requests == REQUESTS and got.request_calls >= REQUESTS, (name, got)
            per_request[name] = got.all_calls / got.http_requests
            before = after
    assert all(v <= 1.05 for v in per_request.values()), per_request
