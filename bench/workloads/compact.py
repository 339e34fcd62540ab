"""JSON vs the compact encoding of logprob answers (protocol/compact.py), end to end over HTTP.

    python -m bench compact [--model PATH] [--tokens 2048] [--ks 0 20 256] [--clients 4] [--requests 24] [--reps 3]

What is measured is the answer's path, not the model: the engine computes each answer once (a real 2,048-token
scoring of the model, per top-k), and a server process replays it for every request through the real ingress (the
app of ingress/app.py: validation, the route's rendering, JSON, uvicorn). Clients (threads, one connection each) send
the route's real request and turn each answer into arrays as a trainer would (numpy from JSON lists, or from the
base64 bytes), so both sides pay encode, transport and decode. Two routes: /generate (SGLang's meta_info rows) and
/v1/completions with vLLM's prompt_logprobs (TRL's teacher request; JSON writes a dict per entry). Reported per route
and top-k: bytes per answer and requests/s for each format, and their ratios. JSON and compact runs alternate; the
median of --reps repetitions. Writes bench/results/compact-<time>.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROUTES = ("generate", "completions")


def compute_answers(model: str, tokens: int, ks: list[int]) -> dict[str, Any]:
    """The engine's real answers, per top-k: a scoring request (/generate's) and TRL's (prompt rows from position 0
    with ranks, one generated token)."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=tokens + 8, max_top_logprobs=max(ks),
                                 max_logprob_entries=(tokens + 1) * (max(ks) + 1)))
    rng = random.Random(0)
    ids = [rng.randrange(100, eng.tokenizer.vocab_size) for _ in range(tokens)]
    out: dict[str, Any] = {"ids": ids, "vocab": eng.tokenizer.vocab_size, "texts": {}, "answers": {}}
    for k in ks:
        score = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=k)
        teacher = replace(score, max_tokens=1, return_input_ranks=True)
        for route, params in (("generate", score), ("completions", teacher)):
            (res,) = eng.generate([ids], [params])
            out["answers"][(route, k)] = res
    wanted = {t for chunk in out["answers"].values() for t in _chunk_ids(chunk)}
    out["texts"] = dict(zip(sorted(wanted), eng.tokenizer.batch_decode([[t] for t in sorted(wanted)]), strict=True))
    return out


def _chunk_ids(chunk: Any) -> set[int]:
    ids = {t for _, t in chunk.input_token_logprobs or ()}
    for row in chunk.input_top_logprobs or ():
        ids.update(t for _, t in row)
    return ids


def serve(data_path: str, port: int) -> None:
    """The server process: the real ingress app over a backend that replays the engine's answers."""
    import uvicorn

    from ingress.app import build_fastapi_app
    from ingress.settings import IngressSettings
    from protocol import ModelInfo

    data = pickle.loads(Path(data_path).read_bytes())
    k_max = max(k for _, k in data["answers"])
    info = ModelInfo(model_name="bench", vocab_size=data["vocab"], max_model_len=len(data["ids"]) + 8,
                     logprobs_mode="raw_logprobs")

    class Replay:
        async def model_info(self) -> ModelInfo:
            return info

        async def ready(self) -> bool:
            return True

        async def answers(self, reqs: list) -> list:
            route = "generate" if reqs[0].params.max_tokens == 0 else "completions"
            return [replace(data["answers"][(route, r.params.top_logprobs_num)], rid=r.rid) for r in reqs]

        async def token_texts(self, ids: list[int]) -> list[str]:
            return [data["texts"][i] for i in ids]

    settings = IngressSettings(max_top_logprobs=k_max, max_logprob_entries=(len(data["ids"]) + 1) * (k_max + 1))
    app = build_fastapi_app(Replay(), settings)  # type: ignore[arg-type]  # the answer path's methods only
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def request(route: str, ids: list[int], k: int, flat: bool) -> tuple[str, dict[str, Any]]:
    if route == "generate":
        body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": k}
        return "/generate", {**body, "return_flat_logprobs_b64": flat}
    body = {"model": "bench", "prompt": [ids], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": k}
    return "/v1/completions", {**body, "return_flat_logprobs_b64": flat}


def b64_array(fields: dict[str, Any], key: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(fields[key]), dtype=dtype)


def to_arrays(route: str, answer: dict[str, Any], k: int, flat: bool) -> tuple[np.ndarray, np.ndarray]:
    """What a trainer takes from the answer: each position's value and its top-k values (ids decoded too)."""
    if route == "generate":
        meta = answer["meta_info"]
        if flat:
            b64_array(meta, "input_token_logprobs_idx_flat_b64", "<i4")
            top = (b64_array(meta, "input_top_logprobs_val_flat_b64", "<f4").reshape(meta["input_top_logprobs_shape"])
                   if k else np.empty(0))
            if k:
                b64_array(meta, "input_top_logprobs_idx_flat_b64", "<i4")
            return b64_array(meta, "input_token_logprobs_val_flat_b64", "<f4"), top
        own = np.array([r[0] for r in meta["input_token_logprobs"]], dtype=np.float32)
        top = np.array([[e[0] for e in row] for row in meta["input_top_logprobs"]], dtype=np.float32) if k else None
        return own, top if top is not None else np.empty(0)
    choice = answer["choices"][0]
    pl = choice["prompt_logprobs"]
    if flat:
        b64_array(pl, "prompt_logprobs_rank_flat_b64", "<i4")
        top = (b64_array(pl, "prompt_top_logprobs_val_flat_b64", "<f4").reshape(pl["prompt_top_logprobs_shape"])
               if k else np.empty(0))
        return b64_array(pl, "prompt_logprobs_val_flat_b64", "<f4"), top
    rows = [sorted(e.items(), key=lambda kv: kv[1]["rank"]) for e in pl[1:]]  # TRL's parse: by rank
    own = np.array([r[0][1]["logprob"] for r in rows], dtype=np.float32)
    top = np.array([[v["logprob"] for _, v in r[:k]] for r in rows], dtype=np.float32) if k else np.empty(0)
    return own, top


def run_side(base: str, route: str, ids: list[int], k: int, flat: bool, clients: int, n: int) -> tuple[float, int]:
    """requests/s of `clients` threads sending `n` requests in all, and the bytes of one answer."""
    path, body = request(route, ids, k, flat)
    payload = json.dumps(body).encode()
    sizes: list[int] = []
    errors: list[str] = []

    def client(count: int) -> None:
        with httpx.Client(base_url=base, timeout=600) as c:
            for _ in range(count):
                try:
                    r = c.post(path, content=payload, headers={"content-type": "application/json"})
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                    return
                if r.status_code != 200:
                    errors.append(r.text[:300])
                    return
                sizes.append(len(r.content))
                to_arrays(route, r.json(), k, flat)

    per = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    threads = [threading.Thread(target=client, args=(c,)) for c in per]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{route} k={k} flat={flat}: {errors[0]}")
    return n / elapsed, sizes[0]


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL

    ap = argparse.ArgumentParser(prog="python -m bench compact", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 20, 256])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24, help="requests per side and repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="the replay server's port (default: a free one)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "results")
    args = ap.parse_args(argv)
    if argv and argv[0] == "serve":
        return serve(argv[1], int(argv[2]))
    data = compute_answers(args.model, args.tokens, args.ks)
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(data, f)
    port = args.port or _free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.workloads.compact", f.name, str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base)
        rows = [_measure(base, route, data["ids"], k, args) for route in ROUTES for k in args.ks]
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        Path(f.name).unlink()
    _report(rows, args)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(base: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the replay server did not start")


def _measure(base: str, route: str, ids: list[int], k: int, args: argparse.Namespace) -> dict[str, Any]:
    run_side(base, route, ids, k, False, 1, 2)  # warm both paths
    run_side(base, route, ids, k, True, 1, 2)
    rates: dict[bool, list[float]] = {False: [], True: []}
    size: dict[bool, int] = {}
    for _ in range(args.reps):
        for flat in (False, True):  # alternating, so drift hits both
            rate, size[flat] = run_side(base, route, ids, k, flat, args.clients, args.requests)
            rates[flat].append(rate)
    json_rps, flat_rps = statistics.median(rates[False]), statistics.median(rates[True])
    row = {"route": route, "top_k": k, "tokens": len(ids), "json_bytes": size[False], "compact_bytes": size[True],
           "size_ratio": size[False] / size[True], "json_req_s": json_rps, "compact_req_s": flat_rps,
           "speed_ratio": flat_rps / json_rps}
    print(f"{route:12s} top-{k:<4d} bytes/answer json {size[False]:>11,d} compact {size[True]:>10,d} "
          f"({row['size_ratio']:.1f}x smaller)  req/s json {json_rps:7.2f} compact {flat_rps:7.2f} "
          f"({row['speed_ratio']:.2f}x)", flush=True)
    return row


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from bench.lib.report import cpu_name

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"compact-{time.strftime('%Y%m%d-%H%M%S')}.json"
    env = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "command": " ".join(sys.argv),
           "clients": args.clients, "requests": args.requests, "reps": args.reps}
    path.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
