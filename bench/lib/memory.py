"""Peak extra memory of scoring one prompt, each side in a fresh process.

After the model is loaded and warmed up on a short prompt (weights are memory-mapped from safetensors: the
first forward pages all of them in, which is not the cost of scoring), the child resets its resident-set
high-water mark (/proc/self/clear_refs = 5), runs once, and reports VmHWM - VmRSS-before: what scoring
itself adds. The engine allocates its KV cache (and
hidden-state / log-sum-exp stores) when it is built, before the reset, so the child sizes that cache to the
prompt and adds those tensors' bytes: both sides then count the KV cache the prompt needs.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import torch

WARMUP_TOKENS = 16


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(x) for x in obj.values())
    return 0


def engine_state_bytes(engine: Any) -> int:
    """Bytes of the tensors the engine's runner (and its scorer) hold besides the model's weights."""
    runner = engine.runner
    total = sum(_tensor_bytes(v) for v in vars(runner).values())
    scorer = getattr(runner, "scorer", None)
    return total + (sum(_tensor_bytes(v) for v in vars(scorer).values()) if scorer is not None else 0)


def _child(side: str, model: str, ids: list[int], threads: int, q: Any) -> None:
    from transformers.utils import logging

    from bench.lib.harness import rss_kb

    logging.disable_progress_bar()
    torch.set_num_threads(threads)
    prealloc = 0
    if side == "transformers":
        from bench.lib.baselines import load_transformers, score_one

        hf = load_transformers(Path(model))

        def run(x: list[int]) -> None:
            score_one(hf, x, 0)
    else:
        from bench.lib.rayscore_side import make_engine, score

        block = 16
        eng = make_engine(model, threads, block_size=block, num_kv_blocks=-(-len(ids) // block))
        prealloc = engine_state_bytes(eng)

        def run(x: list[int]) -> None:
            score(eng, [x], [0])
    run(ids[WARMUP_TOKENS - 1::-1])  # not a prefix of ids: nothing for the prefix cache to reuse
    base = rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t = time.perf_counter()
    run(ids)
    seconds = time.perf_counter() - t
    hwm_mb = (rss_kb("VmHWM") - base) / 1024
    q.put({"hwm_delta_mb": hwm_mb, "preallocated_mb": prealloc / 2**20,
           "extra_mb": hwm_mb + prealloc / 2**20, "seconds": seconds})


def peak_extra_memory(side: str, model: str, ids: list[int], threads: int) -> dict[str, float]:
    """side: "rayscore" or "transformers". Runs in a fresh (spawned) process; returns MB figures."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(side, model, ids, threads, q))
    p.start()
    try:
        while True:
            try:
                return q.get(timeout=2)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"the {side} memory process died (exit code {p.exitcode})") from None
    finally:
        p.join(timeout=60)
