"""What long_prefill_token_threshold buys and costs: the figures behind its default (engine/config.py).

    python -m bench long_prefill [--long 4096] [--short 64] [--thresholds 2048 1024 512 256] [--threads 2]

One engine (SmolLM2 by default, max_num_batched_tokens 2048, prefix cache off). Per threshold: a long scoring
prompt runs one step alone, then a short scoring request arrives; reported: the short request's latency (its
arrival to its answer) and steps, the long one's total time with and without the short one, and the long one's
time alone (a threshold must not slow a request that is alone). A threshold equal to the budget is the old
behaviour: no cap.
"""

from __future__ import annotations

import argparse
import time

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.llm_engine import LLMEngine
from protocol.sampling import SamplingParams

SCORE = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)


def _ids(n: int, seed: int) -> list[int]:
    return [(i * 7919 + seed * 104729) % 40000 + 100 for i in range(n)]


def _run(eng: LLMEngine, long_n: int, short_n: int | None, seed: int) -> dict[str, float]:
    """The long request alone, or with a short one arriving after its first step; seconds and steps."""
    t0 = time.perf_counter()
    eng.add_request(f"long-{seed}", _ids(long_n, seed), SCORE)
    done: dict[str, float] = {}
    steps: dict[str, int] = {}
    step, short_t0 = 0, 0.0
    while eng.has_unfinished():
        if step == 1 and short_n:
            short_t0 = time.perf_counter()
            eng.add_request(f"short-{seed}", _ids(short_n, seed + 1), SCORE)
        step += 1
        for out in eng.step():
            if out.finished:
                kind = out.request_id.split("-")[0]
                done[kind], steps[kind] = time.perf_counter(), step
    got = {"long_s": done["long"] - t0, "long_steps": steps["long"]}
    if short_n:
        got |= {"short_s": done["short"] - short_t0, "short_steps": steps["short"] - 1}
    return got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench long_prefill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--long", type=int, default=4096, help="tokens of the long scoring prompt")
    ap.add_argument("--short", type=int, default=64, help="tokens of the short scoring request")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--thresholds", type=int, nargs="+", default=[2048, 1024, 512, 256])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    print(f"long {a.long} tokens, short {a.short} tokens arriving after the long one's first step, budget "
          f"{a.budget}, {a.threads} threads")
    print(f"{'threshold':>9} | {'short s':>7} {'short steps':>11} | {'long s':>6} {'long steps':>10} | "
          f"{'long alone s':>12}")
    for i, t in enumerate(a.thresholds):
        eng = LLMEngine(EngineConfig(model=a.model, device="cpu", num_threads=a.threads, enable_prefix_cache=False,
                                     max_num_batched_tokens=a.budget, long_prefill_token_threshold=t))
        _run(eng, 256, None, seed=100 + i)  # warm-up
        both = _run(eng, a.long, a.short, seed=2 * i)
        alone = _run(eng, a.long, None, seed=2 * i + 1)
        print(f"{t:>9} | {both['short_s']:>7.2f} {both['short_steps']:>11} | {both['long_s']:>6.2f} "
              f"{both['long_steps']:>10} | {alone['long_s']:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
