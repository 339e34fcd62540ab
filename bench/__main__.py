"""rayscore against the tools people would use instead, on one machine, in one run.

    python -m bench run [--quick] [--workload NAME ...] [--model PATH] [--reps N]
    python -m bench list
    python -m bench http [run's options]  workload 5 alone: `run -w http` (short requests, 512-token requests,
                                        streamed generation, worker calls per route by Serve's counters and
                                        one client's 48-token requests over HTTP vs in-process, workload 2's prompts;
                                        --http-part picks one) behind
                                        the Python proxy and HAProxy (--front-door picks one)
    python -m bench <tool> [...]        one of the tools below, each with its own --help

Tools, by folder (bench/lib/ holds the harness, timing and reports; bench/workloads/ the five workloads):
  features/    limits (the largest request's cost), weight_update (a weight update's cost), long_prefill (a short
               request during a long prefill), families (Qwen3-/MoE-shaped weights vs transformers), tp (tensor
               parallelism's per-step cost), score_memory (a scoring chunk's peak bytes per logit on CPU),
               head_dtype (a float32 LM head's time and memory against the bfloat16 head), image_budget (the
               image budget's peak memory and step time with 448- and 1344-pixel images), hybrid (Qwen3.5's
               state snapshots: memory per cached token, cached vs cold scoring of a prompt sharing 90%)
  device/      cuda_check (the prepared GPU run: float32 exactness, 8B bf16 MFU; --cpu-smoke on CPU)
  serving/     offline (rayscore-batch vs a loop), prefix_routing (cache-aware routing), front_door (Serve's
               Python proxy vs HAProxy), peer_vllm (vLLM 0.32's CPU build on the same requests: answers field by
               field, tokens/s), worker_stream (the worker's CPU per streamed token, against another checkout)
  invariance/  invariant (batch-invariant mode vs the default), invariant_cost (its per-kernel cost)
  checks/      (the correctness tools, a package of their own that the tests import) reliability (flood, kill,
               drain, abandon against a server), cluster_faults (node loss and redeploy on several raylets),
               lm_eval_compare (lm-eval through rayscore vs its hf backend), invariant_device (batch-invariant
               mode's checks and bits on this device), config_lifetime (every shipped config started, reloaded
               and stopped twice as `make serve` runs it: what is left)
  workloads/   compact (logprob answers as JSON vs the compact encoding: bytes and requests/s over HTTP at
               top-0/20/256 on 2,048 tokens)

Workloads (default: all, in this order): long (1 long scoring, MFU, bf16, memory), short (2 many short scoring
requests), mc (3 multiple choice with shared contexts), gen (4 generation), http (5 over HTTP: 400 short scoring
requests by 16 / 64 clients and in batches of 8 with the CPU of each serving process and its stages, 512-token
scoring requests by 16 clients, streamed generation by 16 clients, then workload 2's prompts on one and two workers;
--http-part picks one; behind Serve's Python proxy and behind HAProxy with throughput mode, --front-door picks
one). Every ratio comes from both sides run here, alternating, median of --reps repetitions. Prints one table and writes
bench/results/<timestamp>.json and .md. llama.cpp (llama-cpp-python) joins when installed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.lib.harness import Settings, set_threads
from bench.lib.report import Row, environment, table_text, write


def _parser() -> argparse.ArgumentParser:
    from engine.config import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workloads and print the table")
    r.add_argument("--quick", action="store_true", help="every workload shrunk: a few minutes in all")
    r.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the harness runs (figures "
                   "meaningless)")
    r.add_argument("--workload", "-w", action="append", metavar="NAME",
                   help="long, short, mc, gen, http or 1-5; repeat for several (default: all)")
    r.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder (default: the embedded SmolLM2)")
    r.add_argument("--reps", type=int, default=3, help="timed repetitions per side (median)")
    r.add_argument("--threads", type=int, default=2, help="torch threads, the same for every side")
    r.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out even when installed")
    r.add_argument("--http-concurrency", type=int, default=32, help="concurrent HTTP clients in workload 5")
    r.add_argument("--http-part", choices=("all", "short", "long", "stream", "calls", "prompts"), default="all",
                   help="workload 5's parts: the short requests (400 x 48 tokens), 512-token scoring requests, "
                        "streamed generation (64 x 32 tokens), worker calls per HTTP request of each route with one "
                        "client's 48-token requests over HTTP vs in-process, workload 2's prompts, or all five")
    r.add_argument("--front-door", choices=("python", "haproxy", "both"), default="both",
                   help="workload 5's front door: Serve's Python proxy, HAProxy with throughput mode, or both, one "
                        "after the other in processes of their own, each against its own in-process baseline "
                        "(default %(default)s)")
    r.add_argument("--slow-budget", type=float, default=None,
                   help="seconds per repetition a very slow side (bf16 without CPU support) may take before it "
                        "is measured on a shorter prompt (default 20 quick, 60 full)")
    r.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="results folder")
    sub.add_parser("list", help="list the workloads")
    return ap


# Commands with their own arguments, each in its own module.
_TOOLS = {
    "limits": "bench.features.limits", "weight_update": "bench.features.weight_update",
    "long_prefill": "bench.features.long_prefill", "families": "bench.features.families", "tp": "bench.features.tp",
    "lora": "bench.features.lora", "classify": "bench.features.classify",
    "score_memory": "bench.features.score_memory", "head_dtype": "bench.features.head_dtype",
    "image_budget": "bench.features.image_budget", "hybrid": "bench.features.hybrid",
    "cuda_check": "bench.device.cuda_check",
    "reliability": "checks.reliability", "offline": "bench.serving.offline",
    "lm_eval_compare": "checks.lm_eval_compare", "prefix_routing": "bench.serving.prefix_routing",
    "invariant": "bench.invariance.compare", "invariant_cost": "bench.invariance.cost",
    "invariant_device": "checks.invariant_device",
    "compact": "bench.workloads.compact",
    "cluster_faults": "checks.cluster_faults", "config_lifetime": "checks.config_lifetime",
    "front_door": "bench.serving.front_door",
    "peer_vllm": "bench.serving.peer_vllm", "worker_stream": "bench.serving.worker_stream",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "http":  # the name for workload 5: `run -w http` with run's options
        argv = ["run", "-w", "http", *argv[1:]]
    if argv and argv[0] in _TOOLS:
        import importlib

        importlib.import_module(_TOOLS[argv[0]]).main(argv[1:])
        return
    args = _parser().parse_args(argv)
    from bench.workloads import WORKLOADS, resolve

    if args.command == "list":
        for key, (name, _) in WORKLOADS.items():
            print(f"{key:<6} {name}")
        return
    keys = resolve(args.workload)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    settings = Settings(model=args.model, mode=mode, reps=args.reps, threads=args.threads,
                        use_llamacpp=not args.no_llamacpp, http_concurrency=args.http_concurrency,
                        slow_side_budget_s=args.slow_budget or (60.0 if mode == "full" else 20.0),
                        http_part=args.http_part, front_door=args.front_door)
    set_threads(settings.threads)
    from bench.lib.context import Context

    ctx = Context(settings)
    env = environment(settings)
    env["model_path"], env["llamacpp"] = str(ctx.model_path), ctx.llamacpp_status()
    print(f"rayscore bench: {', '.join(WORKLOADS[k][0] for k in keys)}; {mode} run, "
          f"{settings.reps} reps, {settings.threads} threads\n  model {ctx.model_path}\n  {env['cpu']}, torch "
          f"{env['torch']}, transformers {env['transformers']}\n  {env['llamacpp']}", file=sys.stderr, flush=True)
    rows: list[Row] = []
    details: dict[str, Any] = {}
    start = time.perf_counter()
    for key in keys:
        name, fn = WORKLOADS[key]
        t0 = time.perf_counter()
        try:
            got, det = fn(ctx)
        except Exception as e:  # keep the other workloads' results
            traceback.print_exc()
            got, det = [Row(name, "FAILED", "", None, note=f"{type(e).__name__}: {e}")], {"error": repr(e)}
        det["wall_s"] = time.perf_counter() - t0
        rows += got
        details[key] = det
        env["wall_s"] = time.perf_counter() - start
        js, md = write(rows, details, env, args.out, stem=env.get("stem"))
        env["stem"] = js.stem  # later workloads rewrite the same files
        print(f"{name}: done in {det['wall_s']:.0f} s", file=sys.stderr, flush=True)
    print()
    print(table_text(rows))
    print(f"\n{len(keys)} workloads in {time.perf_counter() - start:.0f} s; wrote {js} and {md}")


if __name__ == "__main__":
    main()
