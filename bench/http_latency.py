"""p50/p99 latency of one scoring request over HTTP (a running `serve run`) against the same request
in-process on the engine, in the same script.

    python -m bench.http_latency [--url http://127.0.0.1:8000] [--tokens 128] [--n 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import httpx


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(49152) for _ in range(args.tokens)] for _ in range(args.n)]

    def body(ids: list[int]) -> dict:
        return {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}

    http: list[float] = []
    with httpx.Client(timeout=120) as client:
        client.post(args.url + "/generate", json=body(prompts[0])).raise_for_status()
        for ids in prompts:
            t = time.perf_counter()
            client.post(args.url + "/generate", json=body(ids)).raise_for_status()
            http.append(time.perf_counter() - t)

    import torch

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    torch.set_num_threads(2)
    eng = LLMEngine(EngineConfig(kv_cache_bytes=64 * 2**20))
    sp = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    eng.generate([prompts[0]], sp)
    local: list[float] = []
    for ids in prompts:
        t = time.perf_counter()
        eng.generate([ids], sp)
        local.append(time.perf_counter() - t)
    print(f"{args.tokens}-token scoring, {args.n} sequential requests")
    print(f"{'path':<12}{'p50 ms':>10}{'p99 ms':>10}")
    for name, xs in (("http", http), ("in-process", local)):
        print(f"{name:<12}{pct(xs, 0.5) * 1e3:>10.1f}{pct(xs, 0.99) * 1e3:>10.1f}")
    print(f"HTTP overhead at p50: {(statistics.median(http) - statistics.median(local)) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
