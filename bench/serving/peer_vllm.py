"""The peer check against vLLM itself: vLLM 0.32's CPU build (`make peer-vllm-install`: its own venv, .peer/vllm-venv)
serves the embedded model with `vllm serve <folder> --dtype float32 --enable-scale-out`, rayscore serves it on a local
Ray Serve app, and both get the same prime-rl-shaped requests to /inference/v1/generate (max_tokens 1, temperature 1,
top_p 1, prompt_logprobs 0 / 1 / 5 / 20, with and without flat_logprobs, streamed and not), compared field by field
(bench/serving/peer_compare.py). Then each server alone runs the same scoring workload (512-token prompts scored with
prompt_logprobs 0, 32 prompts, 8 clients) and reports prompt tokens per second. Outside `make test`: the install is
large. `make peer-vllm` runs it.

    python -m bench peer_vllm [--vllm .peer/vllm-venv/bin/vllm] [--model PATH] [--prompts 32] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.serving.peer_compare import Verdict, compare

ROUTE = "/inference/v1/generate"
TEXTS = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden porch.",
    "In 1905 Albert Einstein published four papers that changed how physicists think about space, time and light.",
    "Naïve café owners in Zürich serve crème brûlée; 東京の天気は晴れです。 Emoji: 🙂🚀 and math: ∑ x² ≥ 0.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5",
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} not ready in {timeout_s:g} s")


def start_vllm(vllm: str, model: str, threads: int, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_KVCACHE_SPACE": "2"}
    cmd = [vllm, "serve", model, "--dtype", "float32", "--enable-scale-out", "--port", str(port),
           "--host", "127.0.0.1", "--max-model-len", "2048"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    return f"http://127.0.0.1:{port}", proc


def start_rayscore(model: str, threads: int) -> str:
    import ray
    from ray import serve

    from bench.workloads.http import _deploy

    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    _deploy("peer", dict(model=model, dtype="float32", device="cpu", num_workers=1, num_threads=threads,
                         worker_num_cpus=1, ingress_num_cpus=0.2, max_num_batched_tokens=2048, kv_cache_mb=512))
    return f"http://127.0.0.1:{port}/peer"


def bodies(ids_list: list[list[int]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, ids in enumerate(ids_list):
        for k in (0, 1, 5, 20):
            for flat in (False, True):
                for stream in (False, True):
                    sp = {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": k}
                    if flat:
                        sp["flat_logprobs"] = True
                    name = f"prompt{i} k={k} flat={flat} stream={stream}"
                    out.append((name, {"token_ids": ids, "sampling_params": sp, "stream": stream,
                                       "request_id": f"peer-{i}-{k}-{int(flat)}-{int(stream)}"}))
    return out


def _answer(resp: httpx.Response, stream: bool) -> Any:
    if resp.status_code != 200:
        return {"status": resp.status_code, "body": resp.text[:300]}
    if not stream:
        return resp.json()
    events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def check(rs_url: str, vllm_url: str, ids_list: list[list[int]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    total = Verdict()
    with httpx.Client(timeout=600) as c:
        for name, body in bodies(ids_list):
            a = _answer(c.post(rs_url + ROUTE, json=body), body["stream"])
            b = _answer(c.post(vllm_url + ROUTE, json=body), body["stream"])
            v = compare(a, b)
            total.ties += v.ties
            total.values += v.values
            total.max_diff = max(total.max_diff, v.max_diff)
            results[name] = {"agree": not v.diffs, "diffs": v.diffs[:10], "ties": v.ties, "max_diff": v.max_diff}
            print(f"  {name}: {'agree' if not v.diffs else 'DIFFER'} (max diff {v.max_diff:.2e}, ties {v.ties})"
                  + ("".join(f"\n      {d}" for d in v.diffs[:5])), flush=True)
    agree = sum(r["agree"] for r in results.values())
    return {"requests": len(results), "agree": agree, "values": total.values, "ties": total.ties,
            "max_diff": total.max_diff, "cases": results}


async def _throughput(url: str, prompts: list[list[int]], clients: int) -> float:
    queue = list(prompts)

    async def client(c: httpx.AsyncClient) -> None:
        while queue:
            ids = queue.pop()
            body = {"token_ids": ids, "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0,
                                                          "prompt_logprobs": 0}}
            resp = await c.post(url + ROUTE, json=body)
            resp.raise_for_status()

    async with httpx.AsyncClient(timeout=600) as c:
        await asyncio.gather(*(client(c) for _ in range(2)))  # warm-up on two prompts of the same length
        queue[:] = list(prompts)
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return sum(len(p) for p in prompts) / wall


def _scoring_prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(44)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def _alone(args: argparse.Namespace, model: str, load: list[list[int]]) -> None:
    """One server's scoring workload, alone on the machine."""
    if args.only == "vllm":
        url, proc = start_vllm(args.vllm, model, args.threads, args.out / "peer_vllm_server.log")
        try:
            _wait(url, proc, 900)
            rate = asyncio.run(_throughput(url, load, args.clients))
        finally:
            proc.terminate()
            proc.wait(60)
    else:
        import ray
        from ray import serve

        try:
            rate = asyncio.run(_throughput(start_rayscore(model, args.threads), load, args.clients))
        finally:
            serve.shutdown()
            ray.shutdown()
    print(f"{args.only} alone: {rate:.0f} prompt tokens/s ({args.prompts} x {args.tokens}-token scoring, "
          f"{args.clients} clients)")


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL
    from engine.loading.default_model import ensure_default_model

    ap = argparse.ArgumentParser(prog="python -m bench peer_vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default=".peer/vllm-venv/bin/vllm", help="vLLM's CLI in its own venv")
    ap.add_argument("--model", default=None, help=f"checkpoint folder (default: the embedded {DEFAULT_MODEL})")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of each server")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--only", choices=("rayscore", "vllm"), default=None,
                    help="time one server's scoring workload alone, no comparison (a rerun on a quieter machine)")
    args = ap.parse_args(argv)
    model = str(args.model or ensure_default_model())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids_list = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    load = _scoring_prompts(args.prompts, args.tokens, len(tok))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only is not None:
        _alone(args, model, load)
        return
    report: dict[str, Any] = {"model": model, "threads": args.threads, "workload": {
        "prompts": args.prompts, "tokens": args.tokens, "clients": args.clients, "prompt_logprobs": 0}}
    vllm_url, proc = start_vllm(args.vllm, model, args.threads, args.out / "peer_vllm_server.log")
    try:
        _wait(vllm_url, proc, 900)
        print("vLLM alone: scoring workload ...", flush=True)
        report["vllm_tokens_per_s"] = asyncio.run(_throughput(vllm_url, load, args.clients))
        print(f"  vLLM: {report['vllm_tokens_per_s']:.0f} prompt tokens/s", flush=True)
        rs_url = start_rayscore(model, args.threads)
        print("both: the same requests, compared field by field ...", flush=True)
        report["compare"] = check(rs_url, vllm_url, ids_list)
    finally:
        proc.terminate()
        proc.wait(60)
    print("rayscore alone: scoring workload ...", flush=True)
    try:
        report["rayscore_tokens_per_s"] = asyncio.run(_throughput(rs_url, load, args.clients))
        print(f"  rayscore: {report['rayscore_tokens_per_s']:.0f} prompt tokens/s", flush=True)
    finally:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    cmp = report["compare"]
    print(f"\npeer check: {cmp['agree']}/{cmp['requests']} answers agree (max value diff {cmp['max_diff']:.2e}, "
          f"{cmp['values']} values, {cmp['ties']} ranks/ids accepted as ties)\n"
          f"tokens/s ({args.prompts} x {args.tokens}-token scoring, {args.clients} clients, each alone): rayscore "
          f"{report['rayscore_tokens_per_s']:.0f}, vLLM {report['vllm_tokens_per_s']:.0f}")
    path = args.out / f"peer_vllm_{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    sys.exit(0 if cmp["agree"] == cmp["requests"] else 1)
