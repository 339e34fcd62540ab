"""Benchmark: multiple choice with shared contexts through the engine, prefix cache on vs off, same run.

    python -m bench.prefix_cache [--items 32] [--endings 4]

Each item is one context of 512-1024 tokens scored against 4 endings of 8-32 tokens, all 128 requests submitted
together. Scored at logprob_start_len = context length - 1 (the endings only) and at 0 (the whole prompt).
Every answer is checked against the cache-off answer (1e-4).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.default_model import ensure_default_model
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def workload(items: int, endings: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(items):
        ctx = [rng.randrange(49152) for _ in range(rng.randint(512, 1024))]
        for _ in range(endings):
            out.append((ctx + [rng.randrange(49152) for _ in range(rng.randint(8, 32))], len(ctx)))
    return out


def run(path: Path, cache: bool, reqs: list[tuple[list[int], int]], boundary: str) -> tuple[float, list, dict]:
    eng = LLMEngine(EngineConfig(model=str(path), enable_prefix_cache=cache, kv_cache_bytes=1024 * 2**20,
                                 max_num_batched_tokens=2048))
    params = [SamplingParams(max_tokens=0, return_logprob=True,
                             logprob_start_len=ctx - 1 if boundary == "ctx-1" else 0) for _, ctx in reqs]
    t = time.perf_counter()
    outs = eng.generate([ids for ids, _ in reqs], params)
    return time.perf_counter() - t, outs, eng.stats()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--endings", type=int, default=4)
    ap.add_argument("--out", default="bench/results/prefix_cache.json")
    args = ap.parse_args()
    path = ensure_default_model()
    reqs = workload(args.items, args.endings)
    tokens = sum(len(ids) for ids, _ in reqs)
    print(f"{len(reqs)} requests, {tokens} prompt tokens")
    result: dict = {"date": time.strftime("%Y-%m-%d"), "requests": len(reqs), "prompt_tokens": tokens}
    rows = []
    for i, boundary in enumerate(("ctx-1", "0")):
        order = (True, False) if i % 2 == 0 else (False, True)  # alternate which side runs first
        timings, answers, stats = {}, {}, {}
        for cache in order:
            timings[cache], answers[cache], stats[cache] = run(path, cache, reqs, boundary)
            print(f"  N={boundary:5s} cache {'on ' if cache else 'off'} {timings[cache]:8.1f} s", flush=True)
        diff = max(abs(a - b) for x, y in zip(answers[True], answers[False], strict=True)
                   for (a, _), (b, _) in zip(x.input_token_logprobs, y.input_token_logprobs, strict=True))
        speedup = timings[False] / timings[True]
        hit = stats[True]["prefix_cache_hit_tokens"] / stats[True]["prefix_cache_query_tokens"]
        rows.append((boundary, timings[True], timings[False], speedup, hit, diff))
        result[f"N={boundary}"] = {"cache_on_s": timings[True], "cache_off_s": timings[False], "speedup": speedup,
                                   "hit_rate": hit, "max_abs_diff": diff}
    print(f"\n{'boundary':<14}{'cache on s':>12}{'cache off s':>13}{'speedup':>9}{'hit rate':>10}{'max diff':>10}")
    for b, on, off, sp, hit, diff in rows:
        print(f"{'N = ' + b:<14}{on:>12.1f}{off:>13.1f}{sp:>9.2f}{hit:>10.1%}{diff:>10.1e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
