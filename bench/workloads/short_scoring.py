"""Workload 2, many short scoring requests: prompts of 64-256 tokens submitted together, every row scored
(N = 0), against transformers in padded batches and one forward per request."""

from __future__ import annotations

import statistics
from typing import Any

from bench.lib import baselines as hf_side
from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate, max_abs_diff_requests
from bench.lib.report import Goal, Row

NAME = "2 short scoring"
# Padded tokens per transformers batch (rows x longest prompt, prompts sorted by length): the best of 1024,
# 2048 and 4096 on this 2-core machine, and the engine's own max_num_batched_tokens.
HF_TOKEN_BUDGET = 2048


def prompts(ctx: Context, count: int, seed: int = 201) -> list[list[int]]:
    return ctx.prompts.windows(seed, ctx.prompts.lengths(seed, count, 64, 256))


def run(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    s = ctx.settings
    reqs = prompts(ctx, s.size(256, 32, 4))
    starts = [0] * len(reqs)
    tokens = sum(len(p) for p in reqs)
    hf = ctx.transformers()
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads))
    sides = {
        "rayscore": Side(lambda: rs.score(eng.get(), reqs, starts), eng.prepare),
        "transformers padded": Side(lambda: hf_side.score_padded(hf, reqs, starts, HF_TOKEN_BUDGET, ctx.pad_id)),
        "transformers per request": Side(lambda: hf_side.score_each(hf, reqs, starts)),
    }
    gguf = ctx.gguf()
    llama = hf_side.LlamaCpp(gguf, 256, s.threads, all_logits=True) if gguf else None
    if llama:
        sides["llama.cpp per request"] = Side(lambda: [llama.score(p, 0) for p in reqs])
    bf16 = rs.bf16_side(ctx.model, s.threads)
    if bf16:
        sides["rayscore bf16"] = Side(lambda: rs.score(bf16.get(), reqs, starts), bf16.prepare)
    t = alternate(sides, s.reps, f"{NAME} ({len(reqs)} prompts, {tokens} tokens)")
    eng.close()
    if bf16:
        bf16.close()
    tps = {k: t.rate(k, tokens) for k in sides}
    ours = [rs.rows(o) for o in t.warmup["rayscore"]]
    ref = t.warmup["transformers per request"]
    diff = max_abs_diff_requests(ours, ref)
    padded_diff = max_abs_diff_requests(t.warmup["transformers padded"], ref)
    label = f"scoring tokens/s, {len(reqs)} prompts of 64–256 tokens"
    rows = [
        Row(NAME, label, "tok/s", tps["rayscore"], "transformers padded batches", tps["transformers padded"],
            Goal(">=", 1.5), t.noise("rayscore", "transformers padded")),
        Row(NAME, label, "tok/s", tps["rayscore"], "transformers, one forward per request",
            tps["transformers per request"]),
        Row(NAME, "max |logprob − transformers|, fp32", "", diff),
    ]
    details: dict[str, Any] = {"prompts": len(reqs), "tokens": tokens, "seconds": t.seconds, "spread": t.summary(),
                               "tokens_per_s": tps,
                               "max_abs_diff": diff, "padded_vs_per_request_max_abs_diff": padded_diff,
                               "hf_token_budget": HF_TOKEN_BUDGET}
    if bf16:
        rows += _bf16_rows(label, tps, [rs.rows(o) for o in t.warmup["rayscore bf16"]], ref, details)
    if llama:
        theirs = t.warmup["llama.cpp per request"]
        mean_ours = statistics.fmean(v for r in ours for v in r)
        mean_theirs = statistics.fmean(v for r, _ in theirs for v in r)
        rows += [Row(NAME, label, "tok/s", tps["rayscore"], "llama.cpp per request (Q4_1 GGUF)",
                     tps["llama.cpp per request"]),
                 Row(NAME, "mean logprob vs llama.cpp", "", mean_ours, "llama.cpp", mean_theirs)]
        details["llamacpp"] = {"mean_logprob": mean_theirs}
        llama.close()
    return rows, details


def _bf16_rows(label: str, tps: dict[str, float], theirs: list[list[float]], ref: list[list[float]],
               details: dict[str, Any]) -> list[Row]:
    """For information (the goal is float32's): the bfloat16 engine on the same prompts, and how far its rows sit
    from the float32 answer."""
    diffs = [abs(a - b) for r, f in zip(theirs, ref, strict=True) for a, b in zip(r, f, strict=True)]
    details["bf16"] = {"max_abs_diff": max(diffs), "mean_abs_diff": statistics.fmean(diffs)}
    return [Row(NAME, label + ", bf16 engine", "tok/s", tps["rayscore bf16"], "transformers padded batches fp32",
                tps["transformers padded"]),
            Row(NAME, "bf16 |logprob − fp32 transformers|, max", "", max(diffs)),
            Row(NAME, "bf16 |logprob − fp32 transformers|, mean", "", statistics.fmean(diffs))]
