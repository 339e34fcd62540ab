"""What the largest request costs a worker, per candidate limit: the figures behind the defaults of
max_top_logprobs and max_logprob_entries (engine/config.py) and max_request_bytes (deploy/config.py).

    python -m bench limits [--ks 20 100 1000] [--rows 2000] [--threads 2]

Each case runs in a fresh process, as a worker runs it: the engine thread scores a `rows`+1-token prompt with
top-k, its deltas are the carriers (RequestOutput, sent as they are), and the event loop hands them on while a
ticker measures how long the loop is held at most. Reported: worker seconds (request in, carriers out) and CPU
seconds (what a busy machine does not distort), the worker's extra peak memory (VmHWM after a reset, minus the
resident set before), the pickled carriers (what Ray sends the ingress), the JSON body (what the client receives)
and the time json.dumps takes to write it (json_s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import pickle
import time
from typing import Any

from workers.stats import process_memory


async def _run_one(engine: Any, ids: list[int], k: int) -> tuple[list[Any], float]:
    """The request through the engine, as the worker streams it, and the longest gap of a 5 ms ticker."""
    from protocol.sampling import SamplingParams

    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=k)
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    chunks = [c async for c in engine.generate(f"limits-{k}", ids, params)]
    done.set()
    await tick
    return chunks, max(gaps, default=0.0)


def _case(model: str, rows: int, k: int, threads: int, out: mp.Queue) -> None:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from ingress.generate.render import chunk_json
    from protocol import merge_outputs

    cfg = EngineConfig(model=model, device="cpu", num_threads=threads, kv_cache_bytes=256 << 20,
                       max_top_logprobs=1 << 20, max_logprob_entries=1 << 40)
    engine = AsyncEngine(cfg)
    ids = [(i * 7919) % 40000 + 100 for i in range(rows + 1)]
    asyncio.run(_run_one(engine, ids[:32], 5))  # warm-up: weights paged in, kernels chosen
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM
    rss_before, _ = process_memory()
    t0, c0 = time.perf_counter(), time.process_time()
    chunks, stall = asyncio.run(_run_one(engine, ids, k))
    worker_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    blob = pickle.dumps(chunks, protocol=5)
    pickle_s = time.perf_counter() - t0 - worker_s
    _, peak = process_memory()
    t1 = time.perf_counter()
    body = json.dumps(chunk_json(merge_outputs(chunks)), separators=(",", ":")).encode()
    json_s = time.perf_counter() - t1
    engine.shutdown()
    out.put({"k": k, "rows": rows, "entries": rows * (1 + k), "worker_s": round(worker_s, 2),
             "worker_cpu_s": round(cpu_s, 2),
             "pickle_s": round(pickle_s, 2), "worker_extra_mib": round((peak - rss_before) / 2**20),
             "pickled_mb": round(len(blob) / 1e6, 1), "json_mb": round(len(body) / 1e6, 1),
             "json_s": round(json_s, 2),
             "max_loop_stall_ms": round(stall * 1000)})


def run(ks: list[int], rows: int, threads: int, model: str) -> list[dict]:
    ctx = mp.get_context("spawn")
    results = []
    for k in ks:
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=_case, args=(model, rows, k, threads, q))
        p.start()
        results.append(q.get(timeout=1800))
        p.join()
        print(json.dumps(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python -m bench limits", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 20, 100, 1000])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args(argv)
    run(args.ks, args.rows, args.threads, args.model)
