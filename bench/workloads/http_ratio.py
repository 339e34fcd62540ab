"""Workload 5, the serving path's time on one client's 48-token requests (issue 41): each request's time over
HTTP through the app (Serve's proxy, the ingress, one worker) against the same request through the engine in this
process, one request at a time, in the same run on the same model, for the two shapes of workload 5's short
requests: the text of 48 tokens to /v1/completions (echo, the prompt's logprobs) and 48 ids to /generate. The
in-process side of the text shape tokenizes with the model's tokenizer first, as a client library would.

Every repetition sends a new set of distinct prompts (the same set to both sides of a shape, another to the other
shape); the in-process engine is a fresh one per repetition, so neither side finds a prompt in its prefix cache.
The in-process engine runs in a thread, as a worker runs its engine (http_short.in_a_thread).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

import httpx

from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate, max_abs_diff_requests
from bench.lib.report import Row
from bench.serving import serving_cpu
from bench.workloads import http_short

NAME = "5 over HTTP, one client's 48-token requests"
TOKENS = 48


def measure(ctx: Context, url: str, app: str, kv_cache_mb: int) -> tuple[list[Row], dict[str, Any]]:
    """Against `app`, already deployed under `url` with one worker and a `kv_cache_mb` KV cache (the in-process
    engine gets the same)."""
    s = ctx.settings
    n = s.size(32, 8, 2)
    tok = ctx.tokenizer
    # Per shape and repetition a set of its own: the one worker serves both shapes, and a text tokenizes to the ids
    # it was decoded from, which the worker would find in its prefix cache.
    sets: dict[str, list[tuple[list[list[int]], list[str]]]] = {}
    for shape, seed in (("ids", 4800), ("text", 9600)):
        sets[shape] = []
        for k in range(s.reps + 1):
            rng = random.Random(seed + k)
            ids = [ctx.prompts.window(rng, TOKENS) for _ in range(n)]
            sets[shape].append((ids, [tok.decode(p) for p in ids]))
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, kv_cache_bytes=kv_cache_mb * 2**20,
                                                max_num_batched_tokens=2048))
    base = f"{url}/{app}"
    client = httpx.Client(timeout=600)
    model = client.get(base + "/v1/models").json()["data"][0]["id"]
    names = ("in-process ids", "http ids", "in-process text", "http text")
    calls = dict.fromkeys(names, 0)
    cpu: dict[str, list[serving_cpu.Snapshot]] = {k: [] for k in names}

    def next_set(name: str) -> tuple[list[list[int]], list[str]]:
        k = calls[name]
        calls[name] += 1
        return sets[name.split()[-1]][k]

    def with_cpu(name: str, go: Callable[[], list[list[float]]]) -> Callable[[], list[list[float]]]:
        """`go`, and the CPU each process spent on it (the warm-up's not kept)."""
        def run() -> list[list[float]]:
            before = serving_cpu.snapshot(app)
            out = go()
            if calls[name] > 1:
                cpu[name].append(serving_cpu.snapshot(app).minus(before))
            return out
        return run

    def in_process(texts: bool) -> list[list[float]]:
        ids, text = next_set("in-process text" if texts else "in-process ids")
        prompts = (lambda: [tok.encode(t, add_special_tokens=False) for t in text]) if texts else (lambda: ids)
        return http_short.in_a_thread(lambda: [rs.rows(rs.score(eng.get(), [p], [0])[0]) for p in prompts()])

    def over_http(texts: bool) -> list[list[float]]:
        ids, text = next_set("http text" if texts else "http ids")
        out = []
        for p, t in zip(ids, text, strict=True):
            if texts:
                r = client.post(base + "/v1/completions", json={"model": model, "prompt": t, "max_tokens": 0,
                                                                "echo": True, "logprobs": 0})
                r.raise_for_status()
                out.append(r.json()["choices"][0]["logprobs"]["token_logprobs"][1:])
            else:
                r = client.post(base + "/generate", json={"input_ids": p, "max_tokens": 0, "return_logprob": True,
                                                          "logprob_start_len": 0})
                r.raise_for_status()
                out.append([v for v, _ in r.json()["meta_info"]["input_token_logprobs"]])
        return out

    def fresh_engine() -> None:  # a new engine's one-time kernel set-up, untimed (as http_short.py's)
        eng.prepare()
        http_short.in_a_thread(lambda: rs.score(eng.get(), [list(range(1, 1 + TOKENS))], [0]))

    sides = {"in-process ids": Side(with_cpu("in-process ids", lambda: in_process(False)), fresh_engine),
             "http ids": Side(with_cpu("http ids", lambda: over_http(False))),
             "in-process text": Side(with_cpu("in-process text", lambda: in_process(True)), fresh_engine),
             "http text": Side(with_cpu("http text", lambda: over_http(True)))}
    try:
        t = alternate(sides, s.reps, f"{NAME} ({n} requests a side, one at a time)")
    finally:
        client.close()
        eng.close()
    ms = {k: statistics.median(1e3 * sec / n for sec in t.seconds[k]) for k in names}
    cpu_ms = {k: http_short.cpu_ms(cpu[k], n) for k in names}

    def split(shape: str) -> str:
        over = cpu_ms[f"http {shape}"]
        roles = ", ".join(f"{r} {over.get(r, 0):.1f}" for r in ("proxy", "ingress", "worker", "client"))
        return (f"CPU-ms per request over HTTP: {roles}; in-process: "
                f"{cpu_ms[f'in-process {shape}'].get('client', 0):.1f}")

    # /generate's rows start at the second token; the completion's token_logprobs[1:] too.
    diff = max(max_abs_diff_requests(t.warmup["http ids"], t.warmup["in-process ids"]),
               max_abs_diff_requests(t.warmup["http text"], t.warmup["in-process text"]))
    rows = [Row(NAME, f"ms per request, {TOKENS}-token text to /v1/completions (echo, logprobs 0)", "ms",
                ms["http text"], "in-process engine (tokenize, then score)", ms["in-process text"],
                note="; ".join(x for x in (split("text"), t.noise("http text", "in-process text")) if x)),
            Row(NAME, f"ms per request, {TOKENS} ids to /generate (scoring)", "ms", ms["http ids"],
                "in-process engine", ms["in-process ids"],
                note="; ".join(x for x in (split("ids"), t.noise("http ids", "in-process ids")) if x)),
            Row(NAME, "max |logprob over HTTP − in-process|, one client's 48-token requests", "", diff)]
    return rows, {"requests": n, "seconds": t.seconds, "spread": t.summary(), "ms_per_request": ms, "cpu_ms": cpu_ms,
                  "ratio": {shape: ms[f"http {shape}"] / ms[f"in-process {shape}"] for shape in ("text", "ids")},
                  "max_abs_diff": diff}
