"""Benchmark: prefix-aware routing (workers/router.py) against Serve's default power-of-two choices.

    python -m bench prefix_routing [--workers 4] [--contexts 8] [--endings 4] [--concurrency 4] [--out FILE]

Starts its own local Ray (8 logical CPUs), deploys the embedded SmolLM2 on --workers small CPU workers,
once per router, and sends the same workload over HTTP: --contexts shared contexts of 128-256 tokens,
each followed by --endings endings of 8-16 tokens, scored from the context's last token
(logprob_start_len = context_len - 1), in shuffled order with --concurrency requests in flight.
Reports the prefix-cache hit rate (sum of meta_info.cached_tokens / sum of prompt tokens), the wall
time, and how the requests spread over the workers. Each router gets fresh workers (empty caches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

VOCAB = 49152  # SmolLM2


@dataclass
class Result:
    router: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    wall_s: float
    # requests finished per worker (from the workers' stats), most loaded first
    per_worker: list[int]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def workload(contexts: int, endings: int, seed: int) -> list[tuple[list[int], int]]:
    """(input_ids, context_len) per request, shuffled."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(contexts):
        ctx = [rng.randrange(VOCAB) for _ in range(rng.randint(128, 256))]
        for _ in range(endings):
            reqs.append((ctx + [rng.randrange(VOCAB) for _ in range(rng.randint(8, 16))], len(ctx)))
    rng.shuffle(reqs)
    return reqs


async def send_all(url: str, reqs: list[tuple[list[int], int]], concurrency: int) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(ids: list[int], ctx_len: int) -> dict[str, Any]:
            body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": ctx_len - 1}
            async with sem:
                r = await client.post(url + "/generate", json=body)
            r.raise_for_status()
            return r.json()["meta_info"]

        return await asyncio.gather(*(one(ids, n) for ids, n in reqs))


def finished_per_worker(app: str, workers: int) -> dict[int, int]:
    """requests_finished of each worker replica, by pid (the handle spreads stats calls over replicas)."""
    from ray import serve

    handle = serve.get_deployment_handle("EngineWorker", app_name=app)
    seen: dict[int, int] = {}
    for _ in range(12 * workers):
        st = handle.stats.remote().result(timeout_s=60)
        seen[st.pid] = st.requests_finished
    return seen


def run_one(router: str, url: str, base_args: dict[str, Any], reqs: list[tuple[list[int], int]],
            concurrency: int) -> Result:
    from ray import serve

    from deploy.app import build_app

    app, prefix = f"bench-{router}", f"/bench-{router}"
    args = {**base_args, "prefix_aware_routing": router == "prefix"}
    serve.run(build_app(args), name=app, route_prefix=prefix, blocking=False)
    deadline = time.monotonic() + 600
    while (st := serve.status().applications.get(app)) is None or st.status != "RUNNING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{app} not RUNNING: {st}")
        time.sleep(0.5)
    try:
        # Warm every worker with short prompts (under one block: no prefix to route by, nothing cached).
        rng = random.Random(1)
        warm = [([rng.randrange(VOCAB) for _ in range(8)], 1) for _ in range(4 * base_args["num_workers"])]
        asyncio.run(send_all(url + prefix, warm, concurrency))
        before = finished_per_worker(app, base_args["num_workers"])
        t0 = time.perf_counter()
        metas = asyncio.run(send_all(url + prefix, reqs, concurrency))
        wall = time.perf_counter() - t0
        after = finished_per_worker(app, base_args["num_workers"])
        per_worker = sorted((after[p] - before.get(p, 0) for p in after), reverse=True)
        return Result(router, len(metas), sum(m["prompt_tokens"] for m in metas),
                      sum(m["cached_tokens"] for m in metas), wall, per_worker)
    finally:
        serve.delete(app)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--contexts", type=int, default=8)
    ap.add_argument("--endings", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--kv-cache-mb", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the results as JSON here")
    a = ap.parse_args(argv)

    import ray
    from ray import serve

    from engine.loading.default_model import ensure_default_model

    ensure_default_model()  # convert once here, not in every worker at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    base_args = dict(model="smollm2-135m-instruct", dtype="float32", device="cpu", kv_cache_mb=a.kv_cache_mb,
                     max_num_batched_tokens=512, max_num_seqs=32, num_workers=a.workers, worker_num_cpus=0.5,
                     num_threads=1, ingress_num_cpus=0.1)
    reqs = workload(a.contexts, a.endings, a.seed)
    try:
        results = [run_one(r, f"http://127.0.0.1:{port}", base_args, reqs, a.concurrency)
                   for r in ("default", "prefix")]
    finally:
        serve.shutdown()
        ray.shutdown()

    print(f"{a.contexts} contexts x {a.endings} endings, {a.workers} workers, kv_cache_mb={a.kv_cache_mb}, "
          f"concurrency {a.concurrency}")
    print(f"{'router':<9}{'requests':>9}{'prompt tok':>12}{'cached tok':>12}{'hit rate':>10}{'wall s':>9}"
          f"{'req/s':>8}  requests per worker")
    for r in results:
        print(f"{r.router:<9}{r.requests:>9}{r.prompt_tokens:>12}{r.cached_tokens:>12}{r.hit_rate:>10.1%}"
              f"{r.wall_s:>9.2f}{r.requests / r.wall_s:>8.2f}  {r.per_worker}")
    base, pref = results
    gain = f"{pref.hit_rate / base.hit_rate:.2f}x" if base.hit_rate else "n/a (default: no hits)"
    print(f"prefix vs default: hit rate {gain}, wall time {base.wall_s / pref.wall_s:.2f}x faster")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "results": [asdict(r) | {"hit_rate": r.hit_rate} for r in results]}, f,
                      indent=2)


if __name__ == "__main__":
    main()
