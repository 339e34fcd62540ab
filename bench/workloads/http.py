"""Workload 5, over HTTP: the short requests of http_short.py, the 512-token requests of http_long.py, the streamed
generation of http_stream.py (issue 24), the worker calls per HTTP request of each route (http_calls.py) and one
client's 48-token requests over HTTP against in-process (http_ratio.py), then
workload 2's prompts sent by concurrent clients to a Serve deployment
with one and with two workers, against the same prompts in-process (the cost of the Serve path), with p50/p99
latency; behind the front door --front-door names (http_doors.py: both by default, each in a process of its own).

Starts its own local Ray in this process, deploys both apps side by side (idle workers cost no CPU) and
alternates in-process / one worker / two workers. Workers keep their prefix caches, so every repetition
uses a new prompt set (the same set for every side of that repetition).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate, max_abs_diff_requests, percentile
from bench.lib.report import Goal, Row
from bench.workloads import http_calls, http_doors, http_long, http_ratio, http_short, http_stream
from bench.workloads.short_scoring import prompts
from checks import serve_calls

NAME = "5 over HTTP"
KV_CACHE_MB = 256  # configs/local.yaml's


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _send(url: str, reqs: list[list[int]], concurrency: int) -> tuple[list[list[float]], list[float], int]:
    """(rows per request, latency per request in s, cached tokens in all)."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        async def one(ids: list[int]) -> tuple[list[float], float, int]:
            body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
            async with sem:
                t = time.perf_counter()
                r = await client.post(url + "/generate", json=body)
                latency = time.perf_counter() - t
            r.raise_for_status()
            meta = r.json()["meta_info"]
            return [v for v, _ in meta["input_token_logprobs"]], latency, meta.get("cached_tokens", 0)

        res = await asyncio.gather(*(one(ids) for ids in reqs))
    return [r[0] for r in res], [r[1] for r in res], sum(r[2] for r in res)


def _deploy(app: str, args: dict[str, Any]) -> None:
    from ray import serve

    from deploy.app import build_app

    serve.run(build_app(args), name=app, route_prefix=f"/{app}", blocking=False)
    deadline = time.monotonic() + 900
    while (st := serve.status().applications.get(app)) is None or st.status != "RUNNING":
        if time.monotonic() > deadline or (st is not None and st.status == "DEPLOY_FAILED"):
            raise RuntimeError(f"app {app} did not start: {st}")
        time.sleep(0.5)


def run(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    import ray
    from ray import serve

    s = ctx.settings
    if s.front_door == "both":
        return http_doors.both(ctx)
    front_door = http_doors.enter(s.front_door)
    count = s.size(256, 32, 4)
    sets = [prompts(ctx, count, seed=501 + k) for k in range(s.reps + 1)]  # [0] is the warm-up's
    tokens = [sum(len(p) for p in ps) for ps in sets]
    ctx.drop_transformers()
    port, metrics_port = _free_port(), _free_port()
    # Serve's counters (the worker calls part) on Ray's Prometheus page; the calls part alone has the replicas hand
    # them over every second (Ray's default, 10 s, only slows the part's reads).
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, _metrics_export_port=metrics_port,
             _system_config={"metrics_report_interval_ms": 1000} if s.http_part == "calls" else None)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
        base = dict(model=ctx.model, dtype="float32", device="cpu", kv_cache_mb=KV_CACHE_MB,
                    max_num_batched_tokens=2048, worker_num_cpus=1, ingress_num_cpus=0.2)
        url = f"http://127.0.0.1:{port}"
        rows: list[Row] = []
        details: dict[str, Any] = {"front_door": front_door}
        if s.http_part in ("all", "short"):  # one fresh worker per side, so each starts cold
            for _, app, *_ in http_short.HTTP_SIDES:
                _deploy(app, {**base, "num_workers": 1, "num_threads": s.threads, **http_short.APP_ARGS.get(app, {})})
            rows, details["short"] = http_short.measure(ctx, url)
            for _, app, *_ in http_short.HTTP_SIDES:  # their CPUs and memory go to the next part's apps
                serve.delete(app)
        if s.http_part in ("all", "long"):  # 512-token scoring, its own fresh worker
            _deploy(http_long.APP, {**base, "num_workers": 1, "num_threads": s.threads})
            got, details["long"] = http_long.measure(ctx, url)
            rows += got
            serve.delete(http_long.APP)
        if s.http_part in ("all", "stream"):  # streamed generation, its own fresh worker
            _deploy(http_stream.APP, {**base, "num_workers": 1, "num_threads": s.threads})
            got, details["stream"] = http_stream.measure(ctx, url)
            rows += got
            serve.delete(http_stream.APP)
        if s.http_part in ("all", "calls"):  # worker calls per HTTP request and serving CPU, route by route, then
            # one client's 48-token requests over HTTP and in-process, on the same app
            _deploy(http_calls.APP, {**base, "num_workers": 1, "num_threads": s.threads})
            got, details["calls"] = http_calls.measure(ctx, url, f"http://127.0.0.1:{metrics_port}/metrics",
                                                       serve_calls.report_interval_s(), s.front_door == "python")
            rows += got
            got, details["ratio"] = http_ratio.measure(ctx, url, http_calls.APP, KV_CACHE_MB)
            rows += got
            serve.delete(http_calls.APP)
        if s.http_part in ("all", "prompts"):
            _deploy("w1", {**base, "num_workers": 1, "num_threads": s.threads})
            _deploy("w2", {**base, "num_workers": 2, "num_threads": max(1, s.threads // 2)})
            got, details["prompts"] = _measure(ctx, url, sets, tokens)
            rows += got
        return rows, details
    finally:
        serve.shutdown()
        ray.shutdown()


def _measure(ctx: Context, url: str, sets: list[list[list[int]]], tokens: list[int]) -> tuple[list[Row], dict]:
    s = ctx.settings
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, kv_cache_bytes=KV_CACHE_MB * 2**20,
                                                max_num_batched_tokens=2048))
    calls = {"in-process": 0, "http 1 worker": 0, "http 2 workers": 0}
    latencies: dict[str, list[float]] = {k: [] for k in calls}
    cached: dict[str, int] = dict.fromkeys(calls, 0)

    def in_process() -> list[list[float]]:
        k = calls["in-process"]
        calls["in-process"] += 1
        outs = rs.score(eng.get(), sets[k], [0] * len(sets[k]))
        if k > 0:
            latencies["in-process"] += [o.finished_time - o.arrival_time for o in outs]
        return [rs.rows(o) for o in outs]

    def over_http(name: str, app: str) -> Callable[[], list[list[float]]]:
        def go() -> list[list[float]]:
            k = calls[name]
            calls[name] += 1
            rows, lat, hit = asyncio.run(_send(f"{url}/{app}", sets[k], s.http_concurrency))
            if k > 0:
                latencies[name] += lat
                cached[name] += hit
            return rows
        return go

    sides = {"in-process": Side(in_process, eng.prepare),
             "http 1 worker": Side(over_http("http 1 worker", "w1")),
             "http 2 workers": Side(over_http("http 2 workers", "w2"))}
    t = alternate(sides, s.reps, f"{NAME} ({len(sets[0])} prompts, {s.http_concurrency} clients)")
    eng.close()
    tps = {k: statistics.median(tokens[r + 1] / sec for r, sec in enumerate(t.seconds[k])) for k in sides}
    diff = max_abs_diff_requests(t.warmup["http 1 worker"], t.warmup["in-process"])
    pct = {k: {"p50_ms": 1e3 * percentile(v, 0.5), "p99_ms": 1e3 * percentile(v, 0.99)}
           for k, v in latencies.items()}
    label = f"scoring tokens/s, workload 2 ({len(sets[0])} prompts)"
    note = (f"{s.http_concurrency} concurrent HTTP clients; in-process submits all prompts at once; latency = "
            "request sent → answer (in-process: arrival → finish)")
    rows = [
        Row(NAME, label + ", 1 worker (2 threads)", "tok/s", tps["http 1 worker"], "in-process engine",
            tps["in-process"], Goal(">=", 0.8), t.noise("http 1 worker", "in-process")),
        Row(NAME, label + ", 2 workers (1 thread each)", "tok/s", tps["http 2 workers"], "in-process engine",
            tps["in-process"]),
    ]
    for name in ("http 1 worker", "http 2 workers"):
        for q in ("p50", "p99"):
            first = (name, q) == ("http 1 worker", "p50")
            rows.append(Row(NAME, f"{q} latency, {name[5:]}", "ms", pct[name][f"{q}_ms"], "in-process engine",
                            pct["in-process"][f"{q}_ms"], note=note if first else ""))
    rows.append(Row(NAME, "max |logprob over HTTP − in-process|", "", diff))
    details = {"prompts": len(sets[0]), "tokens_per_set": tokens, "seconds": t.seconds, "spread": t.summary(),
               "tokens_per_s": tps, "latency": pct, "cached_tokens": cached, "concurrency": s.http_concurrency,
               "max_abs_diff": diff}
    return rows, details
