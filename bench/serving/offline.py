"""Offline scoring on Ray Data against the in-process engine and a transformers padded-batch loop, on the same data.

    python -m bench offline [--rows 64] [--threads 2] [--batch-size 32] [--model PATH]

Data: --rows prompts of 64-256 tokens of real text (bench/lib/prompts.py), scored from N = 0, written as a JSONL of
ids. Sides, one run each (this is a throughput figure for bench/reports/, not a test):
- in-process: one LLMEngine (built untimed; in a plain Ray task, no Ray Data) scoring every row at once through
  offline/dataset_scorer.py, run first and again last (their mean is the figure: a shared machine's load drifts);
- transformers: padded batches sorted by length (bench/lib/baselines.py, the same token budget as workload 2);
- pipeline: `rayscore-batch`'s pipeline (read_json -> map_batches on an actor pool -> write_parquet) on a local
  cluster of logical CPUs, with one actor of --threads threads, then two actors of --threads / 2 threads each.
A pipeline's wall time includes starting its actors and loading the model in them, so its throughput is taken
at the margin: the same pipeline on the first row alone and on all rows, tokens / (T(rows) - T(1 row)). The
end-to-end figure (start-up included, against the in-process engine with its model load) is printed too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def make_prompts(model_path: Path, rows: int, seed: int = 301) -> list[list[int]]:
    from bench.lib.prompts import PromptSource
    from engine.loading.loader import load_tokenizer

    source = PromptSource(load_tokenizer(model_path), min_tokens=60_000)
    return source.windows(seed, source.lengths(seed, rows, 64, 256))


def in_process(model: str, threads: int, prompts: list[list[int]]) -> tuple[float, float, list[list[float]]]:
    """(seconds to build the engine, seconds to score, rows), every row submitted at once."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from offline.dataset_scorer import DatasetScorer, RowInput

    t0 = time.perf_counter()
    scorer = DatasetScorer(LLMEngine(EngineConfig(model=model, num_threads=threads)), None)
    t1 = time.perf_counter()
    results = scorer.score([RowInput(ids=p) for p in prompts])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, [r.token_logprobs or [] for r in results]


def transformers_padded(model_path: Path, prompts: list[list[int]], threads: int) -> float:
    import torch

    from bench.lib.baselines import load_transformers, score_padded
    from bench.workloads.short_scoring import HF_TOKEN_BUDGET

    torch.set_num_threads(threads)

    hf = load_transformers(model_path)
    t0 = time.perf_counter()
    score_padded(hf, prompts, [0] * len(prompts), HF_TOKEN_BUDGET)
    return time.perf_counter() - t0


def pipeline(work: Path, name: str, model: str, prompts: list[list[int]], actors: int, threads: int,
             batch_size: int) -> tuple[float, Path]:
    """Wall seconds of one whole pipeline run (actor start and model load included) and its output folder."""
    from offline.columns import Columns
    from offline.pipeline import BatchJob, WindowSpec, run

    src = work / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"id": i, "input_ids": p}) + "\n" for i, p in enumerate(prompts)))
    out = work / f"{name}.out"
    job = BatchJob(str(src), str(out), Columns(ids="input_ids"), dict(model=model, num_threads=threads),
                   windows=WindowSpec(enabled=False), batch_size=batch_size, num_cpus=1.0, min_actors=actors,
                   max_actors=actors)
    t0 = time.perf_counter()
    run(job)
    return time.perf_counter() - t0, out


def marginal(work: Path, name: str, model: str, prompts: list[list[int]], actors: int, threads: int,
             batch_size: int) -> tuple[float, float, Path]:
    """(seconds for the rows beyond start-up, wall seconds for the rows, output of that run)."""
    t0, _ = pipeline(work, name + "-1", model, prompts[:1], actors, threads, batch_size)
    t1, out = pipeline(work, name, model, prompts, actors, threads, batch_size)
    return t1 - t0, t1, out


def max_diff(out: Path, ref: list[list[float]]) -> float:
    rows = pq.read_table(out, columns=["token_logprobs"]).column(0).to_pylist()
    return max(abs(a - b) for r, f in zip(rows, ref, strict=True) for a, b in zip(r, f, strict=True))


def main(argv: list[str] | None = None) -> None:
    from engine.config import DEFAULT_MODEL
    from engine.loading.default_model import resolve_model_path

    ap = argparse.ArgumentParser(prog="python -m bench offline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch threads: of the in-process engine, of "
                    "transformers and of the one actor; two actors get half each")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per map_batches call")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args(argv)
    import ray
    import ray.data

    model_path = resolve_model_path(args.model)
    prompts = make_prompts(model_path, args.rows)
    tokens = sum(len(p) for p in prompts)
    scored = tokens - len(prompts)
    # Logical CPUs: each actor asks for 1, the readers and writers find room beside them.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k == "RAYSCORE_CACHE_DIR"}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # The in-process sides run in a Ray worker process too, so every side sees the same process setup (Ray's
    # environment, nice level); on this shared machine a plain driver process measured several times slower.
    local = ray.remote(num_cpus=1)(lambda f, *a: f(*a))
    try:
        # The in-process engine runs first and last: on a shared machine the load drifts, and the two bracket it.
        build_s, engine_first_s, ref = ray.get(local.remote(in_process, args.model, args.threads, prompts))
        hf_s = ray.get(local.remote(transformers_padded, model_path, prompts, args.threads))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            one_s, one_wall, one_out = marginal(work, "one", args.model, prompts, 1, args.threads, args.batch_size)
            diff = max_diff(one_out, ref)
            half = max(1, args.threads // 2)
            two_s, _, _ = marginal(work, "two", args.model, prompts, 2, half, args.batch_size)
        _, engine_last_s, _ = ray.get(local.remote(in_process, args.model, args.threads, prompts))
    finally:
        ray.shutdown()
    print(f"in-process engine: {engine_first_s:.1f} s first, {engine_last_s:.1f} s last (load drift)")
    engine_s = (engine_first_s + engine_last_s) / 2
    report(args, len(prompts), tokens, scored, build_s, engine_s, hf_s, one_s, one_wall, two_s, diff)


def report(args: Any, n: int, tokens: int, scored: int, build_s: float, engine_s: float, hf_s: float,
           one_s: float, one_wall: float, two_s: float, diff: float) -> None:
    rate = {"in-process engine": scored / engine_s, "transformers padded": scored / hf_s,
            "pipeline, 1 actor": scored / one_s, "pipeline, 2 actors": scored / two_s}
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# offline scoring, {date.today()}, {cpu}, {os.cpu_count()} CPUs (load {load}), {args.threads} threads, "
          f"{args.model}")
    print(f"{n} rows, {tokens} tokens ({scored} scored), map_batches batch_size {args.batch_size}")
    for name, r in rate.items():
        print(f"{name:<22} {r:8.1f} scored tok/s")
    e = rate["in-process engine"]
    print(f"pipeline 1 actor / in-process engine:   {rate['pipeline, 1 actor'] / e:.2f}  (goal >= 0.90)")
    print(f"pipeline 1 actor / transformers padded: {rate['pipeline, 1 actor'] / rate['transformers padded']:.2f}")
    print(f"pipeline 2 actors / 1 actor:            {rate['pipeline, 2 actors'] / rate['pipeline, 1 actor']:.2f}")
    print(f"end to end, start-up included: pipeline {one_wall:.1f} s vs in-process engine "
          f"{build_s + engine_s:.1f} s (model load {build_s:.1f} s) = {(build_s + engine_s) / one_wall:.2f}")
    print(f"max |pipeline row - in-process row|: {diff:.2e}")


if __name__ == "__main__":
    main()
