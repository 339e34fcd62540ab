"""Workload 5, worker calls per HTTP request (issue 41): each route's requests sent one at a time (so no two are
coalesced into one call), and the worker calls they cost as Serve itself counts them: the EngineWorker
deployment's request counter on Ray's Prometheus page, the calls made while serving a request (checks/serve_calls.py),
before and after, over Serve's proxy's count of the HTTP requests. Beside it, the worker's own count of the
request-carrying calls it took (WorkerStats.stream_calls + whole_calls) and the CPU milliseconds per request of the
proxy, the ingress and the worker (bench/serving/serving_cpu.py). The ingress owns the text side (ingress/text.py),
so text prompts, chat templates, echo and token texts cost no call of their own: every route should read 1.

One app, one worker. The 48-token rows are the two shapes of workload 5's short requests: text to /v1/completions
and ids to /generate, and the same ids to vLLM's token route (prompt_logprobs, one token) and streamed 16-token
generations from them on /generate and the token route: where each route's corridor costs CPU (issue 51).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.lib.context import Context
from bench.lib.report import Goal, Row
from bench.serving import serving_cpu
from checks import serve_calls

NAME = "5 over HTTP, worker calls"
APP = "calls"
SERVING = ("proxy", "ingress", "worker")


def _bench_routes(model: str, ids48: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The routes this bench adds to the bound's (checks/serve_calls.py): vLLM's token route on the 48 ids, and
    streamed generation of the same length on it and on /generate."""
    return {
        "/inference/v1/generate, 48 ids, prompt_logprobs": ("/inference/v1/generate", {
            "model": model, "token_ids": ids48,
            "sampling_params": {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}}),
        "/generate, 48 ids, streamed 16 tokens": ("/generate", {
            "input_ids": ids48, "max_tokens": 16, "ignore_eos": True, "temperature": 0, "stream": True,
            "return_logprob": True}),
        "/inference/v1/generate, 48 ids, streamed 16 tokens": ("/inference/v1/generate", {
            "model": model, "token_ids": ids48, "stream": True,
            "sampling_params": {"max_tokens": 16, "ignore_eos": True, "temperature": 0, "logprobs": 0}}),
    }


def _calls(stats: Callable[[], Any]) -> int:
    s = stats()
    return int(s.stream_calls + s.whole_calls)


def measure(ctx: Context, url: str, metrics_url: str, interval_s: float, proxy_counts: bool
            ) -> tuple[list[Row], dict[str, Any]]:
    """The routes against APP, already deployed under `url` with one worker; Serve's counters read from
    `metrics_url`, which the replicas update every `interval_s`. `proxy_counts`: Serve's proxy is the front door
    (it counts the HTTP requests; behind HAProxy the requests sent are the count)."""
    from ray import serve

    worker = serve.get_deployment_handle("EngineWorker", app_name=APP)

    def stats() -> Any:  # a driver's call: Serve files it under no route, outside the requests' calls
        return worker.stats.remote().result()

    n = ctx.settings.size(32, 8, 2)
    tok = ctx.tokenizer
    ids48 = ctx.prompts.window(random.Random(48), 48)
    text48 = tok.decode(ids48)
    base = f"{url}/{APP}"
    with httpx.Client(timeout=600) as client:
        model = client.get(base + "/v1/models").json()["data"][0]["id"]
        per_route: dict[str, dict[str, float]] = {}
        routes = {**serve_calls.routes(model, text48, ids48), **_bench_routes(model, ids48)}
        for name, (path, body) in routes.items():
            for _ in range(2):  # warm-up: the ingress's tokenizer loads at its first text
                serve_calls.post(client, base + path, body)
            served = serve_calls.settled(metrics_url, APP, interval_s)
            calls, before = _calls(stats), serving_cpu.snapshot(APP)
            t = time.perf_counter()
            for _ in range(n):
                serve_calls.post(client, base + path, body)
            seconds = time.perf_counter() - t
            delta = serving_cpu.snapshot(APP).minus(before)
            own = _calls(stats) - calls
            got = serve_calls.settled(metrics_url, APP, interval_s, served.http_requests + n * proxy_counts)
            got = got.minus(served)
            http = got.http_requests if proxy_counts else n
            ms = serving_cpu.per_request_ms(delta, n, SERVING)
            per_route[name] = {"serve_calls_per_request": got.request_calls / http, "serve_http_requests": http,
                               "serve_other_calls": got.other_calls, "worker_calls_per_request": own / n,
                               "proxy_cpu_ms": ms["proxy"], "ingress_cpu_ms": ms["ingress"],
                               "worker_cpu_ms": ms["worker"],
                               "latency_ms": 1e3 * seconds / n}
    rows = []
    for name, got in per_route.items():
        rows.append(Row(NAME, f"worker calls per HTTP request (Serve's counters), {name}", "calls",
                        got["serve_calls_per_request"], goal=Goal("<=", 1.05, on="value"),
                        note=f"{n} requests one at a time; the worker's own count "
                             f"{got['worker_calls_per_request']:.2f}; {got['serve_other_calls']} calls outside "
                             "requests (model-info refresh, this bench's stats reads)"))
        rows.append(Row(NAME, f"proxy + ingress CPU-ms per request, {name}", "ms",
                        got["proxy_cpu_ms"] + got["ingress_cpu_ms"],
                        note=f"proxy {got['proxy_cpu_ms']:.1f}, ingress {got['ingress_cpu_ms']:.1f}"))
        rows.append(Row(NAME, f"worker CPU-ms per request, {name}", "ms", got["worker_cpu_ms"],
                        note="the EngineWorker replica's process: engine thread, torch threads, Ray's"))
    median_calls = statistics.median(g["serve_calls_per_request"] for g in per_route.values())
    return rows, {"requests_per_route": n, "routes": per_route, "median_calls": median_calls}
