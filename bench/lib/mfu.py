"""Model FLOP utilization: the FLOPs a forward needs, over the peak FLOP/s of a large matmul of the same dtype
measured in the same run on the same threads."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def peak_matmul_flops(dtype: torch.dtype, min_size: int = 1024, max_size: int = 4096, max_seconds: float = 1.5,
                      reps: int = 3, device: torch.device | None = None) -> dict[str, Any]:
    """Best median FLOP/s of a square [n, n] x [n, n] product over n = min_size, 2 min_size, ... up to max_size,
    in both layouts: a @ b and a @ b.T (nn.Linear's; on CPUs without native bfloat16 it is ~10x faster than
    a @ b). Stops growing n once one product takes longer than max_seconds.
    Large products only, as the MFU definition asks: from 256 and 512 (operands that sit in the caches, 1-2 ms
    a product) this 2-core VM read outliers such as 191 GFLOP/s for a 512^3 oneDNN product in a run where every
    product from 1024 up read 141-173.
    device: where the operands live (default CPU); on CUDA each product is timed to its end (synchronized)."""
    device = device or torch.device("cpu")
    by_size: dict[str, float] = {}
    n = min_size
    while n <= max_size:
        a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
        slow = False
        for layout, fn in _layouts(dtype, device):
            t0 = time.perf_counter()
            _done(fn(a, b))  # warm-up (and a first estimate of the cost)
            first = time.perf_counter() - t0
            times = []
            for _ in range(reps if first < max_seconds else 1):
                t0 = time.perf_counter()
                _done(fn(a, b))
                times.append(time.perf_counter() - t0)
            by_size[f"{n} {layout}"] = 2 * n**3 / statistics.median(times)
            slow = slow or first > max_seconds
        if slow:
            break
        n *= 2
    best = max(by_size, key=lambda k: by_size[k])
    return {"flops": by_size[best], "shape": best, "by_shape": by_size}


def _done(out: torch.Tensor) -> None:
    """Waits for the product (CUDA runs it asynchronously)."""
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)


def _layouts(dtype: torch.dtype, device: torch.device) -> list[tuple[str, Any]]:
    """aten's a @ b and a @ b.T, and oneDNN's inner product (the engine's CPU float32 linear), whichever is
    fastest here is the peak."""
    out: list[tuple[str, Any]] = [("a@b", torch.mm), ("a@b.T", torch.nn.functional.linear)]
    if torch.backends.mkldnn.is_available() and dtype == torch.float32 and device.type == "cpu":
        out.append(("oneDNN a@b.T", lambda a, b: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")))
    return out


def linear_params(model: Any) -> tuple[int, int]:
    """(weights of the transformer layers' linear maps, weights of the LM head), from a transformers model."""
    layers = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    return layers, model.lm_head.weight.numel()


def forward_flops(model: Any, tokens: int, scored_rows: int, attention: bool = True) -> float:
    """FLOPs to run `tokens` tokens (one causal prompt, no cache) and project `scored_rows` rows through the
    LM head: 2 x weights x tokens for the linear maps, plus (unless attention=False, "counting parameters
    only") causal attention: per layer and head, q.k and p.v cost 2 x head_dim each per (query, key) pair,
    with L (L + 1) / 2 pairs."""
    cfg = model.config
    layer_w, head_w = linear_params(model)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    attention_flops = cfg.num_hidden_layers * heads * 2 * 2 * head_dim * tokens * (tokens + 1) / 2
    return 2 * layer_w * tokens + 2 * head_w * scored_rows + (attention_flops if attention else 0.0)
