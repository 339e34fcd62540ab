"""Workload 5, worker calls per HTTP request (issue 41): each route's requests sent one at a time (so no two are
coalesced into one call), the worker's own count of the request-carrying calls it took (WorkerStats.stream_calls +
whole_calls, read through a handle before and after) divided by the requests, and the CPU milliseconds per request
of the proxy and the ingress (bench/serving/serving_cpu.py). The ingress owns the text side (ingress/text.py), so
text prompts, chat templates, echo and token texts cost no call of their own: every route should read 1.

One app, one worker. The 48-token rows are the two shapes of workload 5's short requests: text to /v1/completions
and ids to /generate.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.lib.context import Context
from bench.lib.report import Goal, Row
from bench.serving import serving_cpu

NAME = "5 over HTTP, worker calls"
APP = "calls"
SERVING = ("proxy", "ingress")


def routes(model: str, text48: str, ids48: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Route name -> (path, body)."""
    return {
        "/v1/completions, 8 text prompts, echo + logprobs": ("/v1/completions", {
            "model": model, "prompt": [f"{text48[:80]} ({i})" for i in range(8)], "max_tokens": 2, "echo": True,
            "logprobs": 2, "temperature": 0}),
        "/v1/chat/completions, streamed, 32 tokens": ("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": text48[:120]}], "max_tokens": 32,
            "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 2, "temperature": 0}),
        "/v1/completions, streamed, 4 text prompts, 16 tokens": ("/v1/completions", {
            "model": model, "prompt": [f"{text48[:80]} ({i})" for i in range(4)], "max_tokens": 16,
            "ignore_eos": True, "stream": True, "logprobs": 1, "temperature": 0}),
        "/generate (SGLang), text, 8 tokens": ("/generate", {
            "text": text48[:120], "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True}),
        "/v1/score, 3 items x 2 labels": ("/v1/score", {
            "query": text48[:80], "items": [" yes", " no", " maybe"], "label_token_ids": [1, 2]}),
        "/v1/completions, 48-token text, scoring": ("/v1/completions", {
            "model": model, "prompt": text48, "max_tokens": 0, "echo": True, "logprobs": 0}),
        "/generate, 48 ids, scoring": ("/generate", {
            "input_ids": ids48, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}),
    }


def _calls(stats: Callable[[], Any]) -> int:
    s = stats()
    return int(s.stream_calls + s.whole_calls)


def measure(ctx: Context, url: str) -> tuple[list[Row], dict[str, Any]]:
    """The routes against APP, already deployed under `url` with one worker."""
    from ray import serve

    worker = serve.get_deployment_handle("EngineWorker", app_name=APP)

    def stats() -> Any:
        return worker.stats.remote().result()

    n = ctx.settings.size(32, 8, 2)
    tok = ctx.tokenizer
    ids48 = ctx.prompts.window(random.Random(48), 48)
    text48 = tok.decode(ids48)
    base = f"{url}/{APP}"
    with httpx.Client(timeout=600) as client:
        model = client.get(base + "/v1/models").json()["data"][0]["id"]
        per_route: dict[str, dict[str, float]] = {}
        for name, (path, body) in routes(model, text48, ids48).items():
            for _ in range(2):  # warm-up: the ingress's tokenizer loads at its first text
                _post(client, base + path, body)
            calls, before = _calls(stats), serving_cpu.snapshot(APP)
            t = time.perf_counter()
            for _ in range(n):
                _post(client, base + path, body)
            seconds = time.perf_counter() - t
            delta = serving_cpu.snapshot(APP).minus(before)
            ms = serving_cpu.per_request_ms(delta, n, SERVING)
            per_route[name] = {"worker_calls_per_request": (_calls(stats) - calls) / n,
                               "proxy_cpu_ms": ms["proxy"], "ingress_cpu_ms": ms["ingress"],
                               "latency_ms": 1e3 * seconds / n}
    rows = []
    for name, got in per_route.items():
        rows.append(Row(NAME, f"worker calls per HTTP request, {name}", "calls", got["worker_calls_per_request"],
                        goal=Goal("<=", 1.05, on="value"), note=f"{n} requests one at a time"))
        rows.append(Row(NAME, f"proxy + ingress CPU-ms per request, {name}", "ms",
                        got["proxy_cpu_ms"] + got["ingress_cpu_ms"],
                        note=f"proxy {got['proxy_cpu_ms']:.1f}, ingress {got['ingress_cpu_ms']:.1f}"))
    median_calls = statistics.median(g["worker_calls_per_request"] for g in per_route.values())
    return rows, {"requests_per_route": n, "routes": per_route, "median_calls": median_calls}


def _post(client: httpx.Client, url: str, body: dict[str, Any]) -> None:
    """One request, read to its end (a stream's every event); a failure stops the bench."""
    if body.get("stream"):
        with client.stream("POST", url, json=body) as r:
            r.raise_for_status()
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
            assert events and json.loads(events[-1][6:]) is not None
        return
    r = client.post(url, json=body)
    r.raise_for_status()
