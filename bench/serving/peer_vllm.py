"""The peer check against vLLM itself: vLLM 0.32's CPU build (`make peer-vllm-install`: its own venv, .peer/vllm-venv)
serves the embedded model with `vllm serve <folder> --dtype float32 --enable-scale-out`, rayscore serves it on a local
Ray Serve app, and both get the same prime-rl-shaped requests to /inference/v1/generate (max_tokens 1, temperature 1,
top_p 1, prompt_logprobs 0 / 1 / 5 / 20, with and without flat_logprobs, streamed and not), compared field by field
(bench/serving/peer_compare.py). Then each server alone, each phase on prompts of its own, every prompt row scored,
runs the scoring loads (`--loads`, default 32 x 512 tokens by 8 clients and 96 x 48 tokens by 16 clients): vLLM on
its token route, rayscore on `/generate`, `/v1/completions` and the token route (`--routes`; the bodies:
bench/serving/peer_load.py), and reports prompt tokens per second, each route's ratio to vLLM's and to rayscore's
`/generate`, and the CPU-ms per request of each serving process. `--profile DIR` then samples rayscore's proxy,
ingress and worker with py-spy during one more phase per route on the last load: each process's CPU by stage and
its hottest frames, written in DIR. Outside `make test`: the install is large. `make peer-vllm` runs it.

    python -m bench peer_vllm [--vllm .peer/vllm-venv/bin/vllm] [--model PATH] [--loads 32x512@8,96x48@16]
                              [--routes generate,completions,token] [--reps N] [--no-compare] [--profile DIR]
                              [--only rayscore|vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.serving import peer_load, serving_cpu, stages
from bench.serving.peer_compare import Verdict, compare
from bench.serving.peer_load import ROUTES, Load, Phase

ROUTE = "/inference/v1/generate"
TEXTS = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden porch.",
    "In 1905 Albert Einstein published four papers that changed how physicists think about space, time and light.",
    "Naïve café owners in Zürich serve crème brûlée; 東京の天気は晴れです。 Emoji: 🙂🚀 and math: ∑ x² ≥ 0.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5",
]


VLLM_ROW = "vLLM token route"


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


def _served_model(url: str) -> str:
    return str(httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["id"])


class Phases:
    """The timed phases of one run: a fresh prompt set per phase (its own seed), results by load and row name, each
    row's repetitions in order (`--reps`: the rayscore routes take turns going first)."""

    def __init__(self, args: argparse.Namespace, window: Any) -> None:
        self.args = args
        self.window = window
        self.results: dict[str, dict[str, list[Phase]]] = {}
        self._seed = 1000

    def _prompts(self, load: Load, warm: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
        self._seed += 1
        return peer_load.prompt_sets(self.window, load, self._seed, warm)

    def run(self, row: str, url: str, route: peer_load.Route, model: str, load: Load,
            cpu: Any) -> Phase:
        warm, prompts = self._prompts(load)
        phase = peer_load.run_phase(url, route, model, warm, prompts, load.clients, cpu,
                                    self.args.completions_max_tokens)
        self.results.setdefault(load.name, {}).setdefault(row, []).append(phase)
        print(f"  {row}, {load.name}: {phase.tokens_per_s:.0f} prompt tokens/s ({phase.seconds:.1f} s; CPU-ms per "
              f"request: {', '.join(f'{k} {v:.1f}' for k, v in phase.cpu_ms.items())})", flush=True)
        return phase

    def vllm(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        model = _served_model(url)
        for _ in range(self.args.reps):
            for load in self.args.loads:
                self.run(VLLM_ROW, url, ROUTES["token"], model, load, lambda: peer_load.tree_cpu_s(proc.pid))

    def rayscore(self, url: str) -> None:
        model = _served_model(url)
        # One untimed phase of every route first (the ingress loads its tokenizer at the first text it needs), so
        # the route that goes first pays no start-up.
        for key in self.args.routes:
            warm, prompts = self._prompts(self.args.loads[-1])
            peer_load.run_phase(url, ROUTES[key], model, warm, prompts[:self.args.loads[-1].clients],
                                self.args.loads[-1].clients, dict, self.args.completions_max_tokens)
        for rep in range(self.args.reps):
            for load in self.args.loads:
                keys = self.args.routes[rep % len(self.args.routes):] + self.args.routes[:rep % len(self.args.routes)]
                for key in keys:
                    self.run(f"rayscore {ROUTES[key].name}", url, ROUTES[key], model, load, _rayscore_cpu)

    def profile(self, url: str) -> list[str]:
        """One more phase per route on the last load, under py-spy: each process's CPU-ms per request by stage and
        its hottest frames (args.profile/<route>/<role>.raw and hot.txt). The lines to print."""
        model = _served_model(url)
        load = self.args.loads[-1]
        lines = []
        for key in self.args.routes:
            route = ROUTES[key]
            warm, prompts = self._prompts(load)
            folder = self.args.profile / key

            def go(r: peer_load.Route = route, w: list[list[int]] = warm, p: list[list[int]] = prompts) -> Phase:
                return peer_load.run_phase(url, r, model, w, p, load.clients, lambda: {},
                                           self.args.completions_max_tokens)

            split, why = stages.profile("peer", len(prompts), go, keep=folder)
            lines.append(f"{route.name}, {load.name}, CPU-ms per request by stage:")
            lines += [f"  {role}: {stages.describe(split[role])}" for role in stages.ROLES if role in split]
            if why:
                lines.append(f"  ({why})")
            hot = []
            for role in stages.ROLES:
                raw = folder / f"{role}.raw"
                if raw.exists():
                    hot.append(f"== {role}")
                    hot += [f"{share:6.1%}  {frame}" for frame, share in stages.hot_frames(raw.read_text(), 40)]
            (folder / "hot.txt").write_text("\n".join(hot) + "\n")
        return lines


def _rayscore_cpu() -> dict[str, float]:
    snap = serving_cpu.snapshot("peer", include_self=False)
    return {role: snap.by_role.get(role, 0.0) for role in ("proxy", "ingress", "worker")}


def _stop_rayscore() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL
    from engine.loading.default_model import ensure_default_model

    ap = argparse.ArgumentParser(prog="python -m bench peer_vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default=".peer/vllm-venv/bin/vllm", help="vLLM's CLI in its own venv")
    ap.add_argument("--model", default=None, help=f"checkpoint folder (default: the embedded {DEFAULT_MODEL})")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of each server")
    ap.add_argument("--loads", type=peer_load.parse_loads, default="32x512@8,96x48@16",
                    help="PROMPTSxTOKENS@CLIENTS, comma-separated (default %(default)s)")
    ap.add_argument("--routes", type=lambda t: [r.strip() for r in t.split(",")],
                    default="generate,completions,token",
                    help="rayscore's routes to time, comma-separated, of: " + ", ".join(ROUTES) + " (default "
                         "%(default)s)")
    ap.add_argument("--completions-max-tokens", type=int, choices=(0, 1), default=0,
                    help="/v1/completions' max_tokens: 0 scores the prompt only, 1 is lm-eval's form")
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions of every phase, each on prompts of its own (the routes take turns going "
                         "first); the table gives the medians")
    ap.add_argument("--no-compare", action="store_true", help="skip the field-by-field comparison")
    ap.add_argument("--profile", type=Path, default=None,
                    help="a folder: one more phase per rayscore route on the last load under py-spy (stages.py)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--only", choices=("rayscore", "vllm"), default=None,
                    help="time one server's phases alone, no comparison (a rerun on a quieter machine)")
    args = ap.parse_args(argv)
    if unknown := [r for r in args.routes if r not in ROUTES]:
        ap.error(f"--routes: {unknown} not among {list(ROUTES)}")
    model = str(args.model or ensure_default_model())
    from transformers import AutoTokenizer

    from bench.lib.prompts import PromptSource

    tok = AutoTokenizer.from_pretrained(model)
    ids_list = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    phases = Phases(args, PromptSource(tok).window)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"model": model, "threads": args.threads, "loads": [vars(x) for x in args.loads],
                              "routes": args.routes, "completions_max_tokens": args.completions_max_tokens,
                              "load_average_start": os.getloadavg()}
    rs_url = None
    if args.only != "rayscore":
        vllm_url, proc = start_vllm(args.vllm, model, args.threads, args.out / "peer_vllm_server.log")
        try:
            _wait(vllm_url, proc, 900)
            print("vLLM alone:", flush=True)
            phases.vllm(vllm_url, proc)
            if args.only is None and not args.no_compare:
                rs_url = start_rayscore(model, args.threads)
                print("both: the same requests, compared field by field ...", flush=True)
                report["compare"] = check(rs_url, vllm_url, ids_list)
        finally:
            proc.terminate()
            proc.wait(60)
    if args.only != "vllm":
        try:
            rs_url = rs_url or start_rayscore(model, args.threads)
            print("rayscore alone:", flush=True)
            phases.rayscore(rs_url)
            if args.profile is not None:
                print("\n".join(phases.profile(rs_url)), flush=True)
        finally:
            _stop_rayscore()
    report["load_average_end"] = os.getloadavg()
    report["phases"] = {load: {row: [vars(p) for p in reps] for row, reps in got.items()}
                        for load, got in phases.results.items()}
    table = peer_load.summary(phases.results, args.loads, VLLM_ROW, f"rayscore {ROUTES['generate'].name}")
    print("\n" + "\n".join(table))
    ok = True
    if "compare" in report:
        cmp = report["compare"]
        ok = cmp["agree"] == cmp["requests"]
        print(f"\npeer check: {cmp['agree']}/{cmp['requests']} answers agree (max value diff {cmp['max_diff']:.2e}, "
              f"{cmp['values']} values, {cmp['ties']} ranks/ids accepted as ties)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"peer_vllm_{stamp}.json"
    path.write_text(json.dumps(report, indent=1))
    (args.out / f"peer_vllm_{stamp}.md").write_text("\n".join(table) + "\n")
    print(f"wrote {path}")
    sys.exit(0 if ok else 1)
