"""The worker's CPU per streamed token: a real EngineWorker in this process (no Ray), `--streams` requests at once
generating `--tokens` tokens each with top-`--top` logprobs, every delta pickled as Serve pickles it to send it on.
CPU is read over the streaming alone: the process's (every thread) and the engine thread's with the torch threads it
starts (their OS name, engine/async_engine.py); and, per delta, the thread CPU of the worker's own step on the engine
thread (the callback it hands AsyncEngine.generate, timed around it) and of pickling the delta.

    python -m bench worker_stream [--model PATH] [--tokens 64] [--streams 8] [--top 20] [--reps 3]
                                  [--before DIR]

--before DIR: another checkout to compare with (`git archive <commit> | tar -x -C DIR`): each side runs in a fresh
process of its own, alternating, --reps times each; the table gives each side's median and after/before, the ratio
within this run. The engine's compute is the same on both sides: the difference is what the worker does per delta.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENGINE_THREAD_OS_NAME = "rayscore-engine"


def _engine_threads_cpu() -> float:
    """CPU seconds of this process's threads named as the engine thread (torch's compute threads inherit it)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != ENGINE_THREAD_OS_NAME[:15]:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _time_worker_step(worker: Any, spent: list[float]) -> None:
    """Adds to spent[0] the thread CPU of the callback the worker hands its engine for each delta."""
    engine_generate = worker.engine.generate

    def generate(rid: str, ids: list[int], params: Any, convert: Any, *args: Any, **kwargs: Any) -> Any:
        def timed(out: Any) -> Any:
            t = time.thread_time()
            got = convert(out)
            spent[0] += time.thread_time() - t
            return got

        return engine_generate(rid, ids, params, timed, *args, **kwargs)

    worker.engine.generate = generate


async def _stream_all(worker: Any, reqs: list[Any]) -> tuple[int, int, float]:
    """Every request's deltas, each pickled; (tokens streamed, deltas, thread CPU seconds of the pickling)."""
    counts = [0, 0]
    pickling = [0.0]

    async def one(req: Any) -> None:
        async for chunk in worker.generate(req):
            t = time.thread_time()
            pickle.dumps(chunk, protocol=5)
            pickling[0] += time.thread_time() - t
            ids = getattr(chunk, "new_token_ids", None)
            counts[0] += len(ids if ids is not None else chunk.output_ids)
            counts[1] += 1

    await asyncio.gather(*(one(r) for r in reqs))
    return counts[0], counts[1], pickling[0]


def side(args: argparse.Namespace) -> dict[str, float]:
    """One side's run in this process: the code on sys.path (the checkout this process started in)."""
    from protocol import GenerateRequest, SamplingParams
    from workers.worker import EngineWorker

    worker = EngineWorker({"model": args.model, "dtype": "float32", "num_threads": args.threads})

    def requests(tag: str, tokens: int) -> list[Any]:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, return_logprob=True,
                                top_logprobs_num=args.top)
        return [GenerateRequest(rid=f"{tag}-{i}", input_ids=[100 + 7 * i + j for j in range(16)], params=params)
                for i in range(args.streams)]

    asyncio.run(_stream_all(worker, requests("warm", 4)))
    step = [0.0]
    _time_worker_step(worker, step)
    cpu0, eng0, t0 = time.process_time(), _engine_threads_cpu(), time.perf_counter()
    tokens, deltas, pickling = asyncio.run(_stream_all(worker, requests("timed", args.tokens)))
    cpu, eng, wall = time.process_time() - cpu0, _engine_threads_cpu() - eng0, time.perf_counter() - t0
    return {"tokens": tokens, "deltas": deltas, "cpu_us_per_token": 1e6 * cpu / tokens,
            "engine_cpu_us_per_token": 1e6 * eng / tokens, "worker_step_us_per_delta": 1e6 * step[0] / deltas,
            "pickle_us_per_delta": 1e6 * pickling / deltas, "wall_s": wall}


def _run_side(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    argv = ["--side", "--model", args.model, "--tokens", str(args.tokens), "--streams", str(args.streams),
            "--top", str(args.top), "--threads", str(args.threads)]
    # This file run in `tree` with `tree` first on sys.path: the side's code is the tree's (the other checkout
    # need not have this bench).
    code = (f"import runpy, sys; sys.argv = ['worker_stream', *{argv!r}]; "
            f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')")
    cmd = [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python -m bench worker_stream", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder (default: the embedded SmolLM2)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each request generates")
    ap.add_argument("--streams", type=int, default=8, help="requests streamed at once")
    ap.add_argument("--top", type=int, default=20, help="top logprobs per generated token")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--reps", type=int, default=3, help="runs per side (median)")
    ap.add_argument("--before", type=Path, default=None, help="a checkout to compare with")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # one side, in this process
    args = ap.parse_args(argv)
    if args.side:
        print(json.dumps(side(args)))
        return
    here = Path(__file__).resolve().parents[2]
    trees = {"after": here} if args.before is None else {"before": args.before.resolve(), "after": here}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.reps):
        for name, tree in trees.items():  # alternating: a load change on the shared machine hits both sides
            runs[name].append(_run_side(tree, args))
    print(f"{args.streams} streams x {args.tokens} tokens, top-{args.top} logprobs, {args.threads} threads, "
          f"median of {args.reps}; load average {os.getloadavg()[0]:.1f}")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in med.items():
        print(f"{name:>6}: worker CPU {m['cpu_us_per_token']:8.1f} us/token, engine threads "
              f"{m['engine_cpu_us_per_token']:8.1f} us/token; per delta: the worker's step on the engine thread "
              f"{m['worker_step_us_per_delta']:6.2f} us, pickling {m['pickle_us_per_delta']:6.2f} us; "
              f"{m['deltas']:.0f} deltas, {m['wall_s']:.2f} s")
    if "before" in med:
        for key in ("cpu_us_per_token", "engine_cpu_us_per_token", "worker_step_us_per_delta",
                    "pickle_us_per_delta"):
            print(f"after/before {key}: {med['after'][key] / med['before'][key]:.3f}")


if __name__ == "__main__":
    main()
