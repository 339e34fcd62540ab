"""Workload 1, long scoring: one long prompt scored from N = 0 and from N = L - 64 (the tail only), float32 and
bfloat16 engine modes against a float32 transformers forward, model FLOP utilization, and the peak extra
memory of a longer prompt (each side in a fresh process)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from bench.lib import baselines as hf_side
from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Progress, Side, alternate, max_abs_diff, time_once
from bench.lib.memory import peak_extra_memory
from bench.lib.mfu import forward_flops, peak_matmul_flops
from bench.lib.report import Goal, Row

NAME = "1 long scoring"
TAIL = 64
PROBE = 64  # tokens of the probe that decides whether bfloat16 runs at full length


def run(ctx: Context) -> tuple[list[Row], dict[str, Any]]:
    s = ctx.settings
    n = s.size(2048, 512, 128)
    mem_n = s.size(8192, 2048, 256)
    ids = ctx.prompts.windows(101, [n])[0]
    hf = ctx.transformers()
    fp32 = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads))
    peak32 = peak_matmul_flops(torch.float32)

    sides = {
        "rayscore N=0": Side(lambda: rs.score(fp32.get(), [ids], [0]), fp32.prepare),
        "transformers N=0": Side(lambda: hf_side.score_one(hf, ids, 0)),
        "rayscore N=L-64": Side(lambda: rs.score(fp32.get(), [ids], [n - TAIL]), fp32.prepare),
        "transformers N=L-64": Side(lambda: hf_side.score_one(hf, ids, n - TAIL)),
    }
    gguf = ctx.gguf()
    llama = hf_side.LlamaCpp(gguf, n, s.threads, all_logits=True) if gguf else None
    if llama:
        sides["llama.cpp N=0"] = Side(lambda: llama.score(ids, 0))
    t = alternate(sides, s.reps, f"{NAME} ({n} tokens)")
    peak32 = max(peak32, peak_matmul_flops(torch.float32), key=lambda p: p["flops"])
    tps = {k: t.rate(k, n) for k in sides}
    ours = rs.rows(t.warmup["rayscore N=0"][0])
    ref = t.warmup["transformers N=0"]
    flops = forward_flops(hf, n, n - 1)
    param_flops = forward_flops(hf, n, n - 1, attention=False)
    mfu = {k: 100 * flops / t.median(k) / peak32["flops"] for k in ("rayscore N=0", "transformers N=0")}
    mfu_params = {k: 100 * param_flops / t.median(k) / peak32["flops"] for k in mfu}
    gf = f"{peak32['flops'] / 1e9:.0f} GFLOP/s"
    rows = [
        Row(NAME, f"scoring tokens/s, {n} tokens, N = 0", "tok/s", tps["rayscore N=0"], "transformers forward",
            tps["transformers N=0"], Goal(">=", 1.0), t.noise("rayscore N=0", "transformers N=0")),
        Row(NAME, f"MFU counting parameters only, N = 0 (peak fp32 matmul {gf})", "%", mfu_params["rayscore N=0"],
            "transformers forward", mfu_params["transformers N=0"], Goal(">=", 70, "value")),
        Row(NAME, "MFU counting parameters and attention, N = 0", "%", mfu["rayscore N=0"], "transformers forward",
            mfu["transformers N=0"]),
        Row(NAME, f"scoring tokens/s, N = L − {TAIL}", "tok/s", tps["rayscore N=L-64"],
            "transformers forward (every row projected)", tps["transformers N=L-64"], Goal(">=", 1.3),
            t.noise("rayscore N=L-64", "transformers N=L-64")),
        Row(NAME, "max |logprob − transformers|, fp32", "", max_abs_diff(ours, ref)),
    ]
    details: dict[str, Any] = {"tokens": n, "seconds": t.seconds, "spread": t.summary(), "tokens_per_s": tps,
                               "forward_flops": flops, "parameter_flops": param_flops, "peak_fp32": peak32,
                               "mfu_percent": mfu, "mfu_parameters_only_percent": mfu_params}
    if llama:
        rows += _llamacpp_rows(fp32, ids, t.warmup["llama.cpp N=0"], tps, details)
        llama.close()
    fp32.close()
    rows += _bf16(ctx, n, details)
    rows += _memory(ctx, mem_n, details)
    return rows, details


def _llamacpp_rows(fp32: rs.FreshEngine, ids: list[int], theirs: tuple[list[float], list[int]],
                   tps: dict[str, float], details: dict[str, Any]) -> list[Row]:
    """Speed and aggregates only: llama.cpp runs the Q4_1 weights, so rows are not expected to match."""
    fp32.prepare()
    out = rs.score(fp32.get(), [ids], [0], top=1)[0]
    ours, argmax = rs.rows(out), rs.argmax_rows(out)
    agree = 100 * sum(a == b for a, b in zip(argmax, theirs[1], strict=True)) / len(argmax)
    details["llamacpp"] = {"mean_logprob": statistics.fmean(theirs[0]), "argmax_agreement_percent": agree}
    return [
        Row(NAME, "scoring tokens/s, N = 0, vs llama.cpp (Q4_1 GGUF)", "tok/s", tps["rayscore N=0"],
            "llama.cpp, all logits", tps["llama.cpp N=0"]),
        Row(NAME, "mean logprob, N = 0, vs llama.cpp", "", statistics.fmean(ours), "llama.cpp",
            statistics.fmean(theirs[0])),
        Row(NAME, "argmax agreement with llama.cpp", "%", agree),
    ]


def _bf16(ctx: Context, n: int, details: dict[str, Any]) -> list[Row]:
    """bfloat16 engine against the float32 transformers forward. A probe first: without native bfloat16 on the
    CPU the engine may be far too slow for the full prompt, and is then measured on a shorter one."""
    s = ctx.settings
    hf = ctx.transformers()
    bf16 = rs.FreshEngine(lambda: rs.make_engine(ctx.model, s.threads, dtype="bfloat16"))
    warm, probe = ctx.prompts.windows(102, [PROBE, PROBE])  # two prompts: the second must miss the prefix cache
    bf16.prepare()
    rs.score(bf16.get(), [warm], [0])
    probe_s, _ = time_once(lambda: rs.score(bf16.get(), [probe], [0]))
    m = n
    while m > PROBE and probe_s * m / PROBE > s.slow_side_budget_s:
        m //= 2
    ids = ctx.prompts.windows(101, [n])[0][:m]
    peak16 = peak_matmul_flops(torch.bfloat16)
    sides = {"rayscore bf16": Side(lambda: rs.score(bf16.get(), [ids], [0]), bf16.prepare),
             "transformers fp32": Side(lambda: hf_side.score_one(hf, ids, 0))}
    t = alternate(sides, s.reps, f"{NAME} bf16 ({m} tokens)")
    bf16.close()
    diffs = [abs(a - b) for a, b in zip(rs.rows(t.warmup["rayscore bf16"][0]), t.warmup["transformers fp32"],
                                        strict=True)]
    tps = {k: t.rate(k, m) for k in sides}
    # Parameters only: torch's CPU flash attention runs bf16 at its float32 speed (2048 tokens: 56 vs 53 ms here),
    # ten times a bf16 matmul's rate on a CPU without bf16 units, so counting it against that peak read 114 %.
    mfu = 100 * forward_flops(hf, m, m - 1, attention=False) / t.median("rayscore bf16") / peak16["flops"]
    note = t.noise() if m == n else (
        f"measured on {m} tokens, not {n}: a {PROBE}-token probe took {probe_s:.1f} s in bfloat16 (peak bf16 "
        f"matmul here: {peak16['flops'] / 1e9:.1f} GFLOP/s)")
    details["bf16"] = {"tokens": m, "probe_s": probe_s, "seconds": t.seconds, "spread": t.summary(),
                       "tokens_per_s": tps,
                       "max_abs_diff": max(diffs), "mean_abs_diff": statistics.fmean(diffs),
                       "peak_bf16": peak16, "mfu_percent": mfu}
    gf = f"{peak16['flops'] / 1e9:.1f} GFLOP/s"
    return [
        Row(NAME, f"scoring tokens/s, bf16 engine vs fp32, {m} tokens", "tok/s", tps["rayscore bf16"],
            "transformers forward fp32", tps["transformers fp32"], Goal(">=", 1.8), note),
        Row(NAME, f"MFU bf16 counting parameters only (peak bf16 matmul {gf})", "%", mfu),
        Row(NAME, "bf16 |logprob − fp32 transformers|, max", "", max(diffs)),
        Row(NAME, "bf16 |logprob − fp32 transformers|, mean", "", statistics.fmean(diffs)),
    ]


def _memory(ctx: Context, n: int, details: dict[str, Any]) -> list[Row]:
    ids = ctx.prompts.windows(103, [n])[0]
    mem = {}
    bar = Progress(2, f"{NAME} memory ({n} tokens, fresh processes)")
    for side in ("transformers", "rayscore"):
        bar.note(side)
        mem[side] = peak_extra_memory(side, ctx.model, ids, ctx.settings.threads)
        bar.step(f"{side} {mem[side]['extra_mb']:.0f} MB")
    bar.close()
    details["memory"] = {"tokens": n, **mem}
    pre = mem["rayscore"]["preallocated_mb"]
    return [Row(NAME, f"peak extra memory, {n}-token prompt", "MB", mem["rayscore"]["extra_mb"],
                "transformers forward", mem["transformers"]["extra_mb"], Goal("<=", 0.25),
                f"fresh process per side; rayscore's figure includes its preallocated KV cache sized to the "
                f"prompt ({pre:.0f} MB)")]
