"""The peer bench's timed part (bench/serving/peer_vllm.py): scoring workloads sent by concurrent clients to one
server alone, every prompt position scored, each phase on prompts of its own (no phase hits a prefix another one
cached), and the CPU each serving process spent per request while it ran.

Routes, each asked for the same rows (every prompt token's own logprob, no alternatives):
- `token`: vLLM 0.32's token route, POST /inference/v1/generate with prompt_logprobs 0 and max_tokens 1 (vLLM's
  least), temperature 1: what prime-rl's teacher sends; both servers have it;
- `generate`: rayscore's seed route, POST /generate with input_ids, max_tokens 0, logprob_start_len 0;
- `completions`: POST /v1/completions with the ids as the prompt, echo and logprobs 0, max_tokens 0 (scoring
  only; `--completions-max-tokens 1` is lm-eval's form, one greedy token after the prompt).

A load is `PROMPTSxTOKENS@CLIENTS` (`96x48@16`: 96 prompts of 48 tokens, 16 clients, each sending its next prompt
as its answer arrives). Pure functions and the async timing loop; the servers are peer_vllm.py's.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

Body = Callable[[list[int], str, int], dict[str, Any]]  # (ids, served model name, completions' max_tokens) -> body


@dataclass(frozen=True)
class Load:
    prompts: int
    tokens: int
    clients: int

    @property
    def name(self) -> str:
        return f"{self.prompts} x {self.tokens} tokens, {self.clients} clients"


def parse_loads(text: str) -> list[Load]:
    """`32x512@8,96x48@16` -> the loads, in order; a ValueError names the part that is not of that form."""
    loads = []
    for part in text.split(","):
        try:
            shape, clients = part.strip().split("@")
            prompts, tokens = shape.split("x")
            load = Load(int(prompts), int(tokens), int(clients))
        except ValueError as exc:
            raise ValueError(f"--loads: {part!r} is not PROMPTSxTOKENS@CLIENTS (e.g. 96x48@16)") from exc
        if min(load.prompts, load.tokens, load.clients) < 1 or load.tokens < 2:
            raise ValueError(f"--loads: {part!r} needs at least 1 prompt, 2 tokens and 1 client")
        loads.append(load)
    return loads


def _token_body(ids: list[int], model: str, _: int) -> dict[str, Any]:
    return {"model": model, "token_ids": ids,
            "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 0}}


def _generate_body(ids: list[int], _model: str, _: int) -> dict[str, Any]:
    return {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}


def _completions_body(ids: list[int], model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": ids, "echo": True, "logprobs": 0, "max_tokens": max_tokens,
            "temperature": 0}


def _token_rows(answer: dict[str, Any]) -> list[float]:
    # Row 0 is null (nothing predicts the first token); each row's first entry is the prompt token's own.
    return [next(iter(row.values()))["logprob"] for row in answer["prompt_logprobs"] or () if row]


def _generate_rows(answer: dict[str, Any]) -> list[float]:
    return [value for value, _ in answer["meta_info"]["input_token_logprobs"] or () if value is not None]


def _completions_rows(answer: dict[str, Any]) -> list[float]:
    values = answer["choices"][0]["logprobs"]["token_logprobs"]
    n_prompt = answer["usage"]["prompt_tokens"]
    return [value for value in values[:n_prompt] if value is not None]  # the prompt's rows, not a generated token's


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    body: Body
    rows: Callable[[dict[str, Any]], list[float]]  # an answer -> its prompt rows' values, in order


ROUTES: dict[str, Route] = {
    "token": Route("token route", "/inference/v1/generate", _token_body, _token_rows),
    "generate": Route("/generate", "/generate", _generate_body, _generate_rows),
    "completions": Route("/v1/completions", "/v1/completions", _completions_body, _completions_rows),
}


def prompt_sets(window: Callable[[random.Random, int], list[int]], load: Load, seed: int,
                warm: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """(warm-up prompts, timed prompts) of `load`'s length, cut by `window` (PromptSource.window) with a seed of the
    phase's own: every phase scores prompts no other phase sent. `warm`: how many warm-up prompts (default: one per
    client, so the warm-up sends the phase's batch shapes)."""
    warm = load.clients if warm is None else warm
    rng = random.Random(seed)
    prompts = [window(rng, load.tokens) for _ in range(warm + load.prompts)]
    return prompts[:warm], prompts[warm:]


@dataclass(frozen=True)
class Phase:
    """One timed phase: prompt tokens per second, wall seconds, and CPU-ms per request of each serving process."""

    tokens_per_s: float
    seconds: float
    cpu_ms: dict[str, float]


async def _send(client: httpx.AsyncClient, url: str, route: Route, model: str, queue: list[list[int]],
                completions_max_tokens: int) -> None:
    while queue:
        ids = queue.pop()
        resp = await client.post(url + route.path, json=route.body(ids, model, completions_max_tokens))
        if resp.status_code != 200:
            raise RuntimeError(f"{route.name}: {resp.status_code} {resp.text[:300]}")
        got = len(route.rows(resp.json()))
        if got != len(ids) - 1:
            raise RuntimeError(f"{route.name}: {got} prompt rows scored of a {len(ids)}-token prompt's {len(ids) - 1}")


async def _timed(url: str, route: Route, model: str, warm: list[list[int]], prompts: list[list[int]], clients: int,
                 completions_max_tokens: int, cpu: Callable[[], dict[str, float]]) -> Phase:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        queue = list(warm)
        await asyncio.gather(*(_send(client, url, route, model, queue, completions_max_tokens)
                               for _ in range(len(warm))))
        queue = list(prompts)
        before = cpu()
        t0 = time.perf_counter()
        await asyncio.gather(*(_send(client, url, route, model, queue, completions_max_tokens)
                               for _ in range(clients)))
        wall = time.perf_counter() - t0
        after = cpu()
    n = len(prompts)
    cpu_ms = {role: 1e3 * (after.get(role, 0.0) - before.get(role, 0.0)) / n for role in after}
    return Phase(sum(len(p) for p in prompts) / wall, wall, cpu_ms)


def run_phase(url: str, route: Route, model: str, warm: list[list[int]], prompts: list[list[int]], clients: int,
              cpu: Callable[[], dict[str, float]], completions_max_tokens: int = 0) -> Phase:
    """Time `prompts` sent by `clients` concurrent clients to `route` of the server at `url`, after `warm`; every
    answer must score each prompt position (a RuntimeError otherwise). `cpu()`: CPU seconds so far per process role."""
    return asyncio.run(_timed(url, route, model, warm, prompts, clients, completions_max_tokens, cpu))


def tree_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of a process and its descendants (vLLM's server: its API process and its engine core)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {"server": 0.0}
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return {"server": total}


def median_phase(phases: list[Phase]) -> Phase:
    """The repetitions of one row as one: the median of tokens/s, of seconds and of each role's CPU-ms."""
    return Phase(statistics.median(p.tokens_per_s for p in phases), statistics.median(p.seconds for p in phases),
                 {role: statistics.median(p.cpu_ms.get(role, 0.0) for p in phases) for role in phases[0].cpu_ms})


def summary(results: dict[str, dict[str, list[Phase]]], loads: list[Load], vllm_row: str,
            generate_row: str) -> list[str]:
    """Markdown table lines: per load, each row's tokens/s (the median over its repetitions, each one in brackets
    when there are several), its ratio to vLLM's and to rayscore's /generate (medians), and its CPU-ms per request
    (medians). `results`: load name -> row name -> its phases."""
    lines = ["| load | server, route | prompt tokens/s | / vLLM | / `/generate` | CPU-ms per request |",
             "|---|---|---|---|---|---|"]
    for load in loads:
        got = {name: median_phase(phases) for name, phases in results.get(load.name, {}).items() if phases}
        vllm, gen = got.get(vllm_row), got.get(generate_row)
        for name, phase in got.items():
            reps = results[load.name][name]
            each = f" ({', '.join(f'{p.tokens_per_s:.0f}' for p in reps)})" if len(reps) > 1 else ""
            to_vllm = f"{phase.tokens_per_s / vllm.tokens_per_s:.2f}" if vllm and name != vllm_row else ""
            to_gen = f"{phase.tokens_per_s / gen.tokens_per_s:.2f}" if gen and name != vllm_row else ""
            cpu = ", ".join(f"{role} {ms:.1f}" for role, ms in phase.cpu_ms.items())
            lines.append(f"| {load.name} | {name} | {phase.tokens_per_s:.0f}{each} | {to_vllm} | {to_gen} | {cpu} |")
    return lines
