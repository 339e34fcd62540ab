"""Workload 5, streamed generation over HTTP: 64 prompts of 40 tokens, 32 greedy tokens each, streamed
as server-sent events to 16 concurrent clients, against LLMEngine.generate on the same prompts in batches of 16 in
the same run. Reports generated tokens/s, the CPU milliseconds per generated token of each serving process, and
where each process's CPU goes by stage (bench/serving/stages.py, one untimed repetition under py-spy).

The app has its own worker (a fresh prefix cache); every repetition uses a new prompt set.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from typing import Any

import httpx

from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate
from bench.lib.report import Row
from bench.serving import serving_cpu, stages
from bench.workloads.http_short import in_a_thread

NAME = "5 over HTTP, streamed generation"
APP = "gen16"
PROMPT_TOKENS, NEW_TOKENS, CLIENTS = 40, 32, 16


def prompts(source: Any, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [source.window(rng, PROMPT_TOKENS) for _ in range(count)]


def in_process(engine: Any, reqs: list[list[int]]) -> list[list[int]]:
    """Greedy generation in batches of CLIENTS prompts: as many requests at a time as the HTTP side has clients."""
    out: list[list[int]] = []
    for i in range(0, len(reqs), CLIENTS):
        out += rs.generate_greedy(engine, reqs[i:i + CLIENTS], NEW_TOKENS)
    return out


async def send(url: str, reqs: list[list[int]]) -> list[list[int]]:
    """Each prompt a streamed /generate request, CLIENTS in flight; the ids concatenated from the events."""
    sem = asyncio.Semaphore(CLIENTS)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        async def one(ids: list[int]) -> list[int]:
            body = {"input_ids": ids, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
                    "stream": True}
            got: list[int] = []
            async with sem, client.stream("POST", url + "/generate", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        got += json.loads(line[len("data: "):])["output_ids"]
            return got

        return list(await asyncio.gather(*(one(ids) for ids in reqs)))


def measure(ctx: Context, url: str) -> tuple[list[Row], dict[str, Any]]:
    """The workload against the app APP already deployed under `url` (one worker)."""
    s = ctx.settings
    count = s.size(64, 32, 4)
    sets = [prompts(ctx.prompts, count, seed=2451 + k) for k in range(s.reps + 2)]  # the last: the profile's
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, kv_cache_bytes=256 * 2**20,
                                                max_num_batched_tokens=2048))
    calls = {"in-process": 0, "http": 0}
    cpu: list[serving_cpu.Snapshot] = []

    def http_side() -> list[list[int]]:
        k = calls["http"]
        calls["http"] += 1
        before = serving_cpu.snapshot(APP)
        got = asyncio.run(send(f"{url}/{APP}", sets[k]))
        if k > 0:
            cpu.append(serving_cpu.snapshot(APP).minus(before))
        return got

    def in_process_side() -> list[list[int]]:
        k = calls["in-process"]
        calls["in-process"] += 1
        return in_a_thread(lambda: in_process(eng.get(), sets[k]))

    t = alternate({"in-process": Side(in_process_side, eng.prepare), "http": Side(http_side)}, s.reps,
                  f"{NAME} ({count} x {NEW_TOKENS} tokens, {CLIENTS} clients)")
    eng.close()
    tokens = count * NEW_TOKENS
    tps = {k: statistics.median(tokens / sec for sec in t.seconds[k]) for k in t.seconds}
    same = sum(a == b for a, b in zip(t.warmup["http"], t.warmup["in-process"], strict=True))
    ms = {r: statistics.median(serving_cpu.per_request_ms(c, tokens, [r])[r] for c in cpu) for r in stages.ROLES} \
        if cpu else {}
    split, why = stages.profile(APP, tokens, lambda: asyncio.run(send(f"{url}/{APP}", sets[-1])))
    rows = [Row(NAME, f"generated tokens/s, {count} x {NEW_TOKENS} greedy tokens, {CLIENTS} streamed clients",
                "tok/s", tps["http"], f"in-process, batches of {CLIENTS}", tps["in-process"],
                note=t.noise("http", "in-process")),
            Row(NAME, "CPU-ms per generated token, serving processes ("
                + ", ".join(f"{r} {ms.get(r, 0):.2f}" for r in stages.ROLES) + ")", "ms", sum(ms.values()))]
    rows += stages.rows(NAME, f"{CLIENTS} streamed clients, per generated token", split, why)
    rows.append(Row(NAME, "greedy answers equal to in-process", "", same, f"of {count}", count))
    details = {"seconds": t.seconds, "tokens_per_s": tps, "cpu_ms_per_token": ms, "stages_ms_per_token": split,
               "stages_error": why, "equal_answers": same, "prompts": count}
    return rows, details
