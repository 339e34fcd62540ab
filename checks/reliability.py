"""The reliability script: what a user would try against a running server, with figures.

    python -m bench reliability --start configs/local.yaml [--port 8123]     # start Serve here, then run
    python -m bench reliability --url http://127.0.0.1:8000 --ray-address auto [--app rayscore]

Parts (--parts, default all): fuzz (hook: schemathesis over /openapi.json, added with the ingress side), flood
(bounded clients far beyond a worker's queue: 200/503 counts, 503 latency, exactness of a sample against
transformers, the worker's peak memory), abuse (one client's reused ids, huge error echoes, huge texts, fan-outs,
stop strings, surrogates, hostile headers and 300 slow connections while a prober is served:
checks/one_client.py), kill (SIGKILL a worker under in-flight scoring requests:
answered/lost), drain (redeploy the app twice under load: lost), abandon (streams dropped after their first
event: KV blocks free afterwards). Worker pids, stats and redeploys go through Ray (the worker deployment's
handle), so --url alone runs fuzz, flood and abandon without stats. Prints one JSON line per part and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ATOL = 1e-4


@dataclass
class Ctx:
    url: str
    app: str
    args: dict[str, Any]  # the app's config args (for redeploys)
    prefix: str = "/"
    ray: bool = False  # connected: stats, kill and drain possible
    scale: int = 1  # --quick divides loads
    results: dict[str, Any] = field(default_factory=dict)

    def stats(self) -> list[Any]:
        """Each worker replica's WorkerStats (sampled through the handle, by pid)."""
        from ray import serve

        handle = serve.get_deployment_handle("EngineWorker", app_name=self.app)
        seen = {}
        for _ in range(8):
            st = handle.stats.remote().result(timeout_s=60)
            seen[st.pid] = st
        return list(seen.values())


def ids_of(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 49152) for _ in range(n)]


def score(client: httpx.Client, ctx: Ctx, ids: list[int], stream: bool = False) -> httpx.Response:
    body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0, "stream": stream}
    return client.post(ctx.url + "/generate", json=body)


def reference(ids: list[int]) -> list[float]:
    """transformers' float32 logprobs of ids[1:] (the exactness reference)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.loading.default_model import ensure_default_model

    model = _hf.get("m") or _hf.setdefault("m", AutoModelForCausalLM.from_pretrained(
        ensure_default_model(), dtype=torch.float32).eval())
    with torch.inference_mode():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()


_hf: dict[str, Any] = {}


def exact(rows: list, ids: list[int]) -> bool:
    ref = reference(ids)
    return [t for _, t in rows] == ids[1:] and max(abs(v - e) for (v, _), e in zip(rows, ref, strict=True)) <= ATOL


def _fan_out(n: int, fn: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, range(n)))


# --- parts ----------------------------------------------------------------------------------------------
def fuzz(ctx: Ctx) -> dict[str, Any]:
    """schemathesis over the server's /openapi.json (checks/fuzz.py: checks not_a_server_error,
    status_code_conformance, response_schema_conformance, content_type_conformance), positive and negative
    cases per operation; a server with API keys is fuzzed with the first key of $RAYSCORE_API_KEYS."""
    from checks.fuzz import run_fuzz

    examples = max(5, 50 // ctx.scale)
    key = (os.environ.get("RAYSCORE_API_KEYS") or "").split(",")[0].strip() or None
    cases, failures = run_fuzz(ctx.url, examples, api_key=key)
    return {"cases": cases, "failures": failures, "examples_per_operation_and_mode": examples}


def flood(ctx: Ctx) -> dict[str, Any]:
    clients, length = 128 // ctx.scale, 1024  # ~4x the default queue (max_queued_tokens=32768)
    prompts = [ids_of(length, 1000 + i) for i in range(clients)]
    peak_before = max((s.peak_rss_bytes for s in ctx.stats()), default=0) if ctx.ray else 0

    def one(i: int) -> tuple[int, float, Any]:
        with httpx.Client(timeout=600) as c:
            t0 = time.perf_counter()
            r = score(c, ctx, prompts[i])
            return r.status_code, time.perf_counter() - t0, r.json() if r.status_code == 200 else r.text

    t0 = time.perf_counter()
    answers = _fan_out(clients, one)
    wall = time.perf_counter() - t0
    codes = [a[0] for a in answers]
    refused_ms = sorted(a[1] * 1000 for a in answers if a[0] == 503)
    ok = [i for i, a in enumerate(answers) if a[0] == 200]
    sample = ok[:: max(1, len(ok) // 4)]
    out: dict[str, Any] = {
        "clients": clients, "prompt_tokens": length, "wall_s": round(wall, 1), "ok_200": codes.count(200),
        "refused_503": codes.count(503), "other": len(codes) - codes.count(200) - codes.count(503),
        "refused_p50_ms": round(refused_ms[len(refused_ms) // 2]) if refused_ms else None,
        "exact_sample": f"{sum(exact(answers[i][2]['meta_info']['input_token_logprobs'], prompts[i]) for i in sample)}"
                        f"/{len(sample)}"}
    if ctx.ray:
        stats = ctx.stats()
        out["worker_peak_rss_mib"] = round(max(s.peak_rss_bytes for s in stats) / 2**20)
        out["worker_peak_rss_mib_before"] = round(peak_before / 2**20)
        out["worker_refused_total"] = sum(s.refused for s in stats)
    return out


def kill(ctx: Ctx) -> dict[str, Any]:
    if not ctx.ray:
        return {"skipped": "needs Ray (--start or --ray-address)"}
    n = 32 // ctx.scale
    prompts = [ids_of(256, 2000 + i) for i in range(n)]
    pid = ctx.stats()[0].pid

    def one(i: int) -> int:
        with httpx.Client(timeout=600) as c:
            return score(c, ctx, prompts[i]).status_code

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # kill once the worker holds the requests, not before
            st = ctx.stats()[0]
            if st.running + st.waiting >= n // 2:
                break
            time.sleep(0.05)
        held = st.running + st.waiting
        os.kill(pid, signal.SIGKILL)
        codes = [f.result() for f in futures]
    return {"in_flight": n, "held_by_worker_at_kill": held, "killed_pid": pid, "answered_200": codes.count(200),
            "lost": n - codes.count(200), "codes": sorted(set(codes)), "recovered_s": _recovery_s(ctx)}


def _recovery_s(ctx: Ctx, timeout: float = 300) -> float | None:
    t0 = time.perf_counter()
    with httpx.Client(timeout=60) as c:
        while time.perf_counter() - t0 < timeout:
            if score(c, ctx, ids_of(16, 1)).status_code == 200:
                return round(time.perf_counter() - t0, 1)
            time.sleep(1)
    return None


def drain(ctx: Ctx) -> dict[str, Any]:
    if not ctx.ray:
        return {"skipped": "needs Ray (--start or --ray-address)"}
    from ray import serve

    from deploy.app import build_app

    prompts = [ids_of(200, 3000 + i) for i in range(4)]
    results: list[tuple[int, int, Any]] = []
    stop = threading.Event()

    def client(i: int) -> None:
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                r = score(c, ctx, prompts[i])
                results.append((i, r.status_code, r.json() if r.status_code == 200 else None))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for kv in (ctx.args.get("kv_cache_mb", 512) + 16, ctx.args.get("kv_cache_mb", 512)):  # there and back
        # serve.run waits until the new version is RUNNING (blocking=False only skips waiting for Ctrl-C).
        serve.run(build_app({**ctx.args, "kv_cache_mb": kv}), name=ctx.app, route_prefix=ctx.prefix, blocking=False)
        time.sleep(2)
    stop.set()
    for t in threads:
        t.join(600)
    ok = [(i, body) for i, code, body in results if code == 200]
    return {"requests": len(results), "lost": len(results) - len(ok), "redeploys": 2,
            "exact": all(exact(body["meta_info"]["input_token_logprobs"], prompts[i]) for i, body in ok[:4])}


def abandon(ctx: Ctx) -> dict[str, Any]:
    n = 64 // ctx.scale
    body = {"prompt": "Count slowly to one thousand:", "max_tokens": 2000, "ignore_eos": True, "stream": True}

    def one(i: int) -> bool:
        with httpx.Client(timeout=600) as c, c.stream("POST", ctx.url + "/generate", json=body) as r:
            return next((True for line in r.iter_lines() if line.startswith("data: ")), False)

    got_first = sum(_fan_out(n, one))  # each connection closes after its first event
    out: dict[str, Any] = {"streams": n, "got_first_event": got_first}
    if ctx.ray:
        t0 = time.perf_counter()
        while True:
            used = sum(s.kv_blocks_used + s.running + s.waiting for s in ctx.stats())
            if used == 0 or time.perf_counter() - t0 > 60:
                break
            time.sleep(0.2)
        out.update(kv_blocks_used_after=sum(s.kv_blocks_used for s in ctx.stats()),
                   freed_within_s=round(time.perf_counter() - t0, 1))
    return out


def abuse(ctx: Ctx) -> dict[str, Any]:
    """One client's valid-looking requests against everyone else (checks/one_client.py)."""
    from checks.one_client import abuse as run
    from ingress.settings import IngressSettings

    def queued() -> int:
        return sum(s.queued_tokens for s in ctx.stats())

    timeout = float(ctx.args.get("body_timeout_s", IngressSettings.body_timeout_s))
    return run(ctx.url, ctx.prefix, ids_of, timeout, queued if ctx.ray else None)


PARTS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "fuzz": fuzz, "flood": flood, "abuse": abuse, "abandon": abandon, "drain": drain, "kill": kill}


def _start(config: Path, port: int) -> Ctx:
    """Ray and Serve in this process with the YAML's application, on 127.0.0.1:port (shut down at exit)."""
    import ray
    from ray import serve

    from deploy.app import build_app

    app_cfg = yaml.safe_load(config.read_text())["applications"][0]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    keep_alive = yaml.safe_load(config.read_text()).get("http_options", {}).get("keep_alive_timeout_s", 5)
    serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": keep_alive},
                logging_config={"enable_access_log": False})
    prefix = app_cfg.get("route_prefix", "/")
    serve.run(build_app(app_cfg["args"]), name=app_cfg["name"], route_prefix=prefix, blocking=False)
    url = f"http://127.0.0.1:{port}" + prefix.rstrip("/")
    return Ctx(url=url, app=app_cfg["name"], args=app_cfg["args"], prefix=prefix, ray=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench reliability", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="a running server (without --start)")
    ap.add_argument("--start", type=Path, metavar="CONFIG", help="start Serve here with this YAML's app")
    ap.add_argument("--port", type=int, default=8123, help="HTTP port with --start")
    ap.add_argument("--ray-address", help="the running server's Ray cluster (for stats, kill, drain)")
    ap.add_argument("--app", default="rayscore", help="application name on that cluster")
    ap.add_argument("--config", type=Path, default=Path("configs/local.yaml"),
                    help="the running app's YAML (its args are what drain redeploys)")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--quick", action="store_true", help="half the load")
    args = ap.parse_args(argv)
    if args.start:
        ctx = _start(args.start, args.port)
    else:
        ctx = Ctx(url=args.url.rstrip("/"), app=args.app,
                  args=yaml.safe_load(args.config.read_text())["applications"][0]["args"])
        if args.ray_address:
            import ray

            ray.init(address=args.ray_address, log_to_driver=False)
            ctx.ray = True
    ctx.scale = 2 if args.quick else 1
    try:
        for name in args.parts:
            t0 = time.perf_counter()
            try:
                ctx.results[name] = PARTS[name](ctx)
            except Exception as e:  # keep the other parts' figures
                ctx.results[name] = {"error": f"{type(e).__name__}: {e}"}
            ctx.results[name]["part_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps({name: ctx.results[name]}), flush=True)
    finally:
        if args.start:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    lost = sum(r.get("lost", 0) for r in ctx.results.values())
    print(f"\nreliability: {len(ctx.results)} parts, {lost} lost; "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs")
