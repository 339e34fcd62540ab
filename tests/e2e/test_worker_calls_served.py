"""One HTTP request, one worker call, as Serve itself counts them: on the session's real cluster, Serve's request
counter of the EngineWorker deployment (read from Ray's Prometheus page, checks/serve_calls.py) against Serve's
proxy's count of HTTP requests, route by route, for issue 41's four routes: text completions with echo and
logprobs (8 prompts a request), streamed chat completions of 32 tokens, SGLang text /generate and /v1/score, and
a streamed completion of 4 text prompts (one generate_many call). Every worker call counts, the ingress's own
included: its copy of the model info is confirmed by the version each answer carries, so it makes no call of its
own while answers come.

The requests go one at a time, so the ingress never coalesces two into one call (which would read below 1). What is
counted is calls, not numbers: the app serves the tiny Llama (with a chat template for the chat route), whose
decode steps cost a fraction of the default model's."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ray import serve

from checks import serve_calls
from tests.helpers.serve import app_args, deploy

APP = "worker-calls"
REQUESTS = 8  # per route: one extra call in all would read 1.125
TEXT = ("The committee met on a grey morning to settle the budget for the new library, and after two hours of "
        "argument about the roof they agreed to ask the town for more time.")
# A plain chat template (role, then content, a line each), so the tiny model serves /v1/chat/completions.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def url(serve_url: str, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("worker-calls") / "llama"
    shutil.copytree(tiny_models["llama"], path)
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    deploy(APP, f"/{APP}", app_args(model=str(path), num_workers=1, kv_cache_mb=8))
    yield f"{serve_url}/{APP}"
    serve.delete(APP)


def test_serve_counts_one_worker_call_per_http_request(url: str, metrics_url: str) -> None:
    interval = serve_calls.report_interval_s()
    with httpx.Client(timeout=120) as client:
        model = client.get(url + "/v1/models").json()["data"][0]["id"]
        bodies = {name: serve_calls.routes(model, TEXT, list(range(48)))[name]
                  for name in (*serve_calls.BOUND, serve_calls.STREAMED_MANY)}
        for path, body in bodies.values():  # warm-up: the ingress's first model info and its tokenizer
            serve_calls.post(client, url + path, body)
        before = serve_calls.settled(metrics_url, APP, interval)
        assert before.request_calls > 0 and before.http_requests >= len(bodies), before  # the counters count
        per_request: dict[str, float] = {}
        for name, (path, body) in bodies.items():
            t0 = time.monotonic()
            for _ in range(REQUESTS):
                serve_calls.post(client, url + path, body)
            t1 = time.monotonic()
            after = serve_calls.settled(metrics_url, APP, interval, before.http_requests + REQUESTS)
            print(f"{name}: {REQUESTS} requests {t1 - t0:.1f} s, counters settled {time.monotonic() - t1:.1f} s")
            got = after.minus(before)
            assert got.http_requests == REQUESTS and got.request_calls >= REQUESTS, (name, got)
            per_request[name] = got.all_calls / got.http_requests
            before = after
    assert all(v <= 1.05 for v in per_request.values()), per_request
