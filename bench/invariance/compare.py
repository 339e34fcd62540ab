"""The cost of batch-invariant mode: the engine with `batch_invariant: true` against the default
engine, on the inputs of workloads 1 to 3, in one process, sides alternating, median of --reps repetitions, a fresh
engine before each (no prefix cache carried over). Goal: at most 1.3x slower (throughput ratio >= 0.77).

    python -m bench invariant [--quick] [--reps 3] [--threads 2] [--model PATH] [-w long -w short -w mc]

Also prints how far the invariant mode's rows are from the default mode's (both are held to 1e-4 of transformers).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bench.lib import rayscore_side as rs
from bench.lib.context import Context
from bench.lib.harness import Settings, Side, alternate, max_abs_diff_requests, set_threads
from bench.lib.report import Goal, Row, table_text
from bench.workloads import long_scoring, multiple_choice, short_scoring
from engine.config import DEFAULT_MODEL

GOAL = Goal(">=", round(1 / 1.3, 2))  # invariant throughput / default throughput

# Workload -> (its name, a function of the run giving (prompts, scoring starts, engine settings)).
Inputs = tuple[list[list[int]], list[int], dict[str, int]]


def _long(ctx: Context) -> Inputs:
    n = ctx.settings.size(2048, 512, 128)
    return ctx.prompts.windows(101, [n]), [0], {}


def _short(ctx: Context) -> Inputs:
    reqs = short_scoring.prompts(ctx, ctx.settings.size(256, 32, 4))
    return reqs, [0] * len(reqs), {}


def _mc(ctx: Context) -> Inputs:
    s = ctx.settings
    mc = multiple_choice.items(ctx, s.size(32, 4, 1), *s.size((512, 1024), (512, 1024), (64, 128)))
    reqs = [c + e for c, ends in mc for e in ends]
    starts = [len(c) - 1 for c, ends in mc for _ in ends]
    return reqs, starts, {"kv_cache_bytes": multiple_choice.KV_CACHE_BYTES}


WORKLOADS: dict[str, tuple[str, Callable[[Context], Inputs]]] = {
    "long": (long_scoring.NAME, _long),
    "short": (short_scoring.NAME, _short),
    "mc": (multiple_choice.NAME, _mc),
}


def compare(ctx: Context, name: str, inputs: Inputs) -> list[Row]:
    reqs, starts, overrides = inputs
    s = ctx.settings
    engines = {mode: rs.FreshEngine(lambda on=on: rs.make_engine(ctx.model, s.threads, batch_invariant=on,
                                                                  **overrides))
               for mode, on in (("default", False), ("invariant", True))}
    sides = {mode: Side(lambda e=e: rs.score(e.get(), reqs, starts), e.prepare) for mode, e in engines.items()}
    tokens = sum(len(r) for r in reqs)
    t = alternate(sides, s.reps, f"{name}: invariant vs default ({len(reqs)} requests, {tokens} tokens)")
    for e in engines.values():
        e.close()
    tps = {mode: t.rate(mode, tokens) for mode in sides}
    diff = max_abs_diff_requests(*([rs.rows(o) for o in t.warmup[mode]] for mode in sides))
    return [Row(name, "prompt tokens/s, batch_invariant on vs off", "tok/s", tps["invariant"], "default mode",
                tps["default"], GOAL, t.noise("invariant", "default")),
            Row(name, "max |logprob invariant − default|", "", diff)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench invariant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the workloads' quick sizes")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script runs; figures meaningless)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a checkpoint folder (default: the embedded model)")
    ap.add_argument("--workload", "-w", action="append", choices=list(WORKLOADS), help="default: all three")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    settings = Settings(model=args.model, mode=mode, reps=args.reps, threads=args.threads,
                        use_llamacpp=False, http_concurrency=1, slow_side_budget_s=60.0)
    set_threads(settings.threads)
    ctx = Context(settings)
    start = time.perf_counter()
    rows: list[Row] = []
    for key in args.workload or list(WORKLOADS):
        name, inputs = WORKLOADS[key]
        rows += compare(ctx, name, inputs(ctx))
        print(f"{name}: done at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print()
    print(table_text(rows))
    print("\nratio = invariant / default throughput: 1 / ratio is the slowdown (goal: at most 1.3x).")


if __name__ == "__main__":
    main()
