"""cuda_check's moe section: the experts' matmuls of one MoE layer by the loop (engine/layers/moe_dispatch.py, one
matmul per expert with rows) and by the grouped Triton kernel (engine/layers/moe_triton.py, one launch per
projection), on the same rows sorted by expert, at two teachers' layer shapes: Qwen3-30B-A3B (128 experts of 768
under hidden 2048, top 8) and Qwen3-235B-A22B (128 of 1536 under 4096, top 8). bfloat16 times at a decode-sized
step (16 tokens) and a prefill-sized one (2048 tokens), CUDA events, median of 5 after 2 warm-ups; float32 at 256
tokens: max |grouped - loop| (IEEE products, no TF32). Without CUDA (--cpu-smoke) the loop alone at tiny shapes."""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F

SHAPES: dict[str, tuple[int, int, int, int]] = {  # name: (experts, top k, hidden, expert width)
    "qwen3-30b-a3b": (128, 8, 2048, 768), "qwen3-235b-a22b": (128, 8, 4096, 1536)}
SMOKE_SHAPE = (8, 2, 64, 32)
TOKENS = (16, 2048)


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _inputs(shape: tuple[int, int, int, int], tokens: int, dtype: torch.dtype, dev: torch.device
            ) -> tuple[torch.Tensor, ...]:
    """rows sorted by expert (random top-k routing), counts, the stacks."""
    e, k, h, w = shape
    g = torch.Generator(device=dev).manual_seed(0)
    ids = torch.rand(tokens, e, generator=g, device=dev).topk(k, dim=-1).indices.flatten()
    order = torch.argsort(ids, stable=True)
    x = torch.randn(tokens, h, generator=g, device=dev, dtype=dtype)
    rows = x[order // k]
    counts = torch.bincount(ids, minlength=e)
    gate_up = torch.randn(e, 2 * w, h, generator=g, device=dev, dtype=dtype) * h ** -0.5
    down = torch.randn(e, h, w, generator=g, device=dev, dtype=dtype) * w ** -0.5
    return rows, counts, gate_up, down


def _time_ms(fn: Any, dev: torch.device) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(5):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            times.append(start.elapsed_time(end))
        else:
            import time

            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def moe_section(run: Any) -> dict[str, Any]:
    from engine.layers.moe_dispatch import expert_loop, expert_path

    dev = run.device
    res: dict[str, Any] = {"path_chosen": expert_path(dev)}
    grouped = None
    if dev.type == "cuda":
        from engine.layers.moe_triton import expert_grouped as grouped
    shapes = {"smoke": SMOKE_SHAPE} if run.smoke else SHAPES
    summary: list[tuple[str, str]] = [("path chosen", res["path_chosen"])]
    for name, shape in shapes.items():
        for tokens in TOKENS if not run.smoke else (16,):
            args = (*_inputs(shape, tokens, torch.bfloat16, dev), None, None, _swiglu)
            loop_ms = _time_ms(lambda a=args: expert_loop(*a), dev)
            entry = {"loop_ms": loop_ms}
            if grouped is not None:
                entry["grouped_ms"] = _time_ms(lambda a=args: grouped(*a), dev)
                summary.append((f"{name} T={tokens} bf16", f"loop {loop_ms:.2f} ms, grouped "
                                f"{entry['grouped_ms']:.2f} ms ({loop_ms / entry['grouped_ms']:.1f}x)"))
            else:
                summary.append((f"{name} T={tokens} bf16", f"loop {loop_ms:.2f} ms (grouped: CUDA only)"))
            res[f"{name}_T{tokens}"] = entry
            del args
        if grouped is not None:
            rows, counts, gate_up, down = _inputs(shape, 256, torch.float32, dev)
            want = expert_loop(rows, counts, gate_up, down, None, None, _swiglu)
            got = grouped(rows, counts, gate_up, down, None, None, _swiglu)
            res[f"{name}_f32_max_diff"] = diff = (got - want).abs().max().item()
            summary.append((f"{name} T=256 f32", f"max |grouped - loop| {diff:.1e}"))
            del rows, gate_up, down, want, got
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    res["summary"] = summary
    return res
