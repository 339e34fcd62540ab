"""Workload 3, multiple choice with shared contexts: items of one 512-1024-token context and 4 endings of 8-32
tokens, each request scored from the context's last token (N = context - 1, the ending's rows only). The engine
(prefix cache on, all requests submitted together) against transformers one forward per request and
transformers reusing each context's past_key_values by hand."""

from __future__ import annotations

import random
from typing import Any

from bench.lib import baselines as hf_side
from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate, max_abs_diff_requests
from bench.lib.report import Goal, Row

NAME = "3 multiple choice"
ENDINGS = 4
# 32 x 4 requests over 512-1024-token contexts: ~1.2 GB of KV for the contexts alone (46 KB/token for SmolLM2
# in float32). 1 GiB keeps most contexts resident, as an operator would size it for this job.
KV_CACHE_BYTES = 1024 * 2**20


def items(ctx: Context, count: int, lo: int, hi: int, seed: int = 301) -> list[tuple[list[int], list[list[int]]]]:
    """count items, each a context of lo-hi tokens and ENDINGS endings of 8-32 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        context = ctx.prompts.window(rng, rng.randint(lo, hi))
        out.append((context, [ctx.prompts.window(rng, rng.randint(8, 32)) for _ in range(ENDINGS)]))
    return out


def run(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    s = ctx.settings
    mc = items(ctx, s.size(32, 4, 1), *s.size((512, 1024), (512, 1024), (64, 128)))
    reqs = [c + e for c, ends in mc for e in ends]
    starts = [len(c) - 1 for c, ends in mc for _ in ends]
    hf = ctx.transformers()
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, kv_cache_bytes=KV_CACHE_BYTES))
    sides = {
        "rayscore": Side(lambda: rs.score(eng.get(), reqs, starts), eng.prepare),
        "transformers past_key_values": Side(
            lambda: [r for c, ends in mc for r in hf_side.score_shared_context(hf, c, ends, ctx.pad_id)]),
        "transformers per request": Side(lambda: hf_side.score_each(hf, reqs, starts)),
    }
    t = alternate(sides, s.reps, f"{NAME} ({len(mc)} items x {ENDINGS} endings)")
    cached = sum(o.cached_tokens for o in t.warmup["rayscore"])
    eng.close()
    rps = {k: t.rate(k, len(reqs)) for k in sides}
    ours = [rs.rows(o) for o in t.warmup["rayscore"]]
    ref = t.warmup["transformers per request"]
    diff = max_abs_diff_requests(ours, ref)
    pkv_diff = max_abs_diff_requests(t.warmup["transformers past_key_values"], ref)
    label = f"requests/s, {len(mc)} items × {ENDINGS} endings"
    rows = [
        Row(NAME, label, "req/s", rps["rayscore"], "transformers, one forward per request",
            rps["transformers per request"], Goal(">=", 5.0), t.noise("rayscore", "transformers per request")),
        Row(NAME, label, "req/s", rps["rayscore"], "transformers, past_key_values reused by hand",
            rps["transformers past_key_values"], Goal(">=", 1.5),
            t.noise("rayscore", "transformers past_key_values")),
        Row(NAME, "max |logprob − transformers|, fp32", "", diff),
    ]
    tokens = sum(len(r) for r in reqs)
    details = {"items": len(mc), "endings": ENDINGS, "prompt_tokens": tokens, "engine_cached_tokens": cached,
               "seconds": t.seconds, "spread": t.summary(), "requests_per_s": rps, "max_abs_diff": diff,
               "past_key_values_vs_per_request_max_abs_diff": pkv_diff, "kv_cache_bytes": KV_CACHE_BYTES}
    return rows, details
