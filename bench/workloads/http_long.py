"""Workload 5, 512-token scoring requests over HTTP: every token's logprob of independent 512-token prompts, sent by
16 concurrent clients one request each, against LLMEngine.generate in batches of 8 on the same prompts in the same
run; requests/s and the CPU milliseconds per request of each serving process (proxy, ingress, worker). Where the
engine's share of a request is large, what is left of the serving path's cost shows as the ratio's distance from 1.

One app (one worker, a fresh prefix cache per repetition's prompt set), as http_short.py's sides.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate, max_abs_diff_requests
from bench.lib.report import Goal, Row
from bench.serving import serving_cpu
from bench.workloads import http_short

NAME = "5 over HTTP, 512-token requests"
APP = "l16"
TOKENS = 512
CLIENTS = 16


def prompts(source: Any, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [source.window(rng, TOKENS) for _ in range(count)]


def measure(ctx: Context, url: str) -> tuple[list[Row], dict[str, Any]]:
    """The workload against APP, already deployed under `url` with one worker."""
    s = ctx.settings
    count = s.size(96, 32, 4)
    sets = [prompts(ctx.prompts, count, seed=5120 + k) for k in range(s.reps + 1)]
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, kv_cache_bytes=256 * 2**20,
                                                max_num_batched_tokens=2048))
    names = ("in-process", "http")
    calls = dict.fromkeys(names, 0)
    cpu: dict[str, list[serving_cpu.Snapshot]] = {n: [] for n in names}

    def timed(name: str, app: str | None, go: Any) -> Side:
        def run() -> list[list[float]]:
            k = calls[name]
            calls[name] += 1
            before = serving_cpu.snapshot(app)
            rows = go(sets[k])
            if k > 0:
                cpu[name].append(serving_cpu.snapshot(app).minus(before))
            return rows
        return Side(run, fresh_engine if app is None else None)

    def fresh_engine() -> None:  # a new engine's one-time kernel set-up, untimed (as http_short.py's)
        eng.prepare()
        http_short.in_a_thread(lambda: rs.score(eng.get(), [list(range(1, 65))], [0]))

    sides = {"in-process": timed("in-process", None, lambda reqs: http_short.in_a_thread(
                 lambda: http_short.in_process(eng.get(), reqs, start=0))),
             "http": timed("http", APP, lambda reqs: asyncio.run(http_short.send(f"{url}/{APP}", reqs, CLIENTS, 1,
                                                                                 start=0)))}
    t = alternate(sides, s.reps, f"{NAME} ({count} requests of {TOKENS} tokens)")
    eng.close()
    rps = {k: statistics.median(count / sec for sec in t.seconds[k]) for k in names}
    ms = {k: http_short.cpu_ms(cpu[k], count) for k in names}
    diff = max_abs_diff_requests(t.warmup["http"], t.warmup["in-process"])
    split = ", ".join(f"{r} {ms['http'].get(r, 0):.1f}" for r in (*http_short.SERVING, "client"))
    rows = [Row(NAME, f"requests/s, {count} x {TOKENS} tokens, {CLIENTS} clients", "req/s", rps["http"],
                f"in-process, batches of {http_short.BATCH}", rps["in-process"], Goal(">=", 0.95),
                t.noise("http", "in-process")),
            Row(NAME, f"CPU-ms per request, serving processes, {CLIENTS} clients ({split})", "ms",
                sum(ms["http"].get(r, 0) for r in http_short.SERVING), "in-process engine",
                ms["in-process"].get("client")),
            Row(NAME, "max |logprob over HTTP − in-process|, 512-token requests", "", diff)]
    return rows, {"requests": count, "seconds": t.seconds, "spread": t.summary(), "requests_per_s": rps,
                  "cpu_ms_per_request": ms, "max_abs_diff": diff}
