"""Workload 4, generation: concurrent greedy requests (prompts of 64-128 tokens), a fixed number of new tokens
each (EOS ignored on every side), against transformers `generate` on the same batch, left-padded."""

from __future__ import annotations

from typing import Any

from bench.lib import baselines as hf_side
from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Side, alternate
from bench.lib.report import Goal, Row

NAME = "4 generation"


def run(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    s = ctx.settings
    count, new = s.size((16, 64), (4, 16), (2, 4))
    reqs = ctx.prompts.windows(401, ctx.prompts.lengths(401, count, 64, 128))
    hf = ctx.transformers()
    eng = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads))
    sides = {
        "rayscore": Side(lambda: rs.generate_greedy(eng.get(), reqs, new), eng.prepare),
        "transformers generate": Side(lambda: hf_side.generate_padded(hf, reqs, new, ctx.pad_id)),
    }
    gguf = ctx.gguf()
    llama = hf_side.LlamaCpp(gguf, 128 + new, s.threads, all_logits=False) if gguf else None
    if llama:
        sides["llama.cpp one by one"] = Side(lambda: [llama.generate(p, new) for p in reqs])
    bf16 = rs.bf16_side(ctx.model, s.threads)
    if bf16:
        sides["rayscore bf16"] = Side(lambda: rs.generate_greedy(bf16.get(), reqs, new), bf16.prepare)
    t = alternate(sides, s.reps, f"{NAME} ({count} requests x {new} tokens)")
    eng.close()
    if bf16:
        bf16.close()
    tps = {k: t.rate(k, count * new) for k in sides}
    ours, ref = t.warmup["rayscore"], t.warmup["transformers generate"]
    same = sum(a == b for a, b in zip(ours, ref, strict=True))
    prefix = sum(_common_prefix(a, b) for a, b in zip(ours, ref, strict=True))
    label = f"generated tokens/s, {count} greedy requests × {new} tokens"
    rows = [
        Row(NAME, label, "tok/s", tps["rayscore"], "transformers generate, left-padded batch",
            tps["transformers generate"], Goal(">=", 2.0), t.noise("rayscore", "transformers generate")),
        Row(NAME, "greedy tokens equal to transformers' (before any divergence)", "%",
            100 * prefix / (count * new), note=f"{same}/{count} sequences identical"),
    ]
    details: dict[str, Any] = {"requests": count, "new_tokens": new, "seconds": t.seconds, "spread": t.summary(),
                               "tokens_per_s": tps, "identical_sequences": same, "agreeing_prefix_tokens": prefix}
    if bf16:
        agree = sum(_common_prefix(a, b) for a, b in zip(t.warmup["rayscore bf16"], ref, strict=True))
        details["bf16_agreeing_prefix_tokens"] = agree
        rows += [Row(NAME, label + ", bf16 engine", "tok/s", tps["rayscore bf16"],
                     "transformers generate fp32", tps["transformers generate"]),
                 Row(NAME, "bf16 greedy tokens equal to fp32 transformers' (before any divergence)", "%",
                     100 * agree / (count * new))]
    if llama:
        rows.append(Row(NAME, label, "tok/s", tps["rayscore"], "llama.cpp, one request at a time (Q4_1 GGUF)",
                        tps["llama.cpp one by one"]))
        theirs = t.warmup["llama.cpp one by one"]
        details["llamacpp_agreeing_prefix_tokens"] = sum(
            _common_prefix(a, b) for a, b in zip(ours, theirs, strict=True))
        llama.close()
    return rows, details


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
