"""Sparse mixture-of-experts MLP (Qwen3-MoE, Qwen3-VL-MoE): a softmax router picks top-k experts per token; each
expert is a SwiGLU MLP. Loaded by the checkpoint's names, one of two layouts: Qwen3-MoE's one module per expert
(mlp.gate.weight, mlp.experts.{e}.{gate,up,down}_proj.weight), stacked into [E, ...] tensors by fuse(); or
Qwen3-VL-MoE's experts already stacked (mlp.experts.gate_up_proj [E, 2 x width, hidden], mlp.experts.down_proj
[E, hidden, width], transformers 5's Qwen3VLMoeTextExperts), used as they are.

Dispatch, batched: the T x k (token, expert) pairs are sorted by expert, each expert runs one matmul over all of
its rows (a loop over experts, never over tokens), and each token's k outputs are summed with its router weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from engine.layers.linear import linear


class Expert(nn.Module):
    """One expert's weights under the checkpoint's names; folded into SparseMoeBlock's stacks by fuse()."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)


class StackedExperts(nn.Module):
    """Every expert's weights in two stacks, under the checkpoint's names (transformers 5's Qwen3VLMoeTextExperts).
    They stay parameters, so a weight update (engine/loading/weight_update.py) reaches them."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * width, hidden))  # gate rows, then up rows
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, width))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: Any, stacked: bool = False) -> None:
        """stacked: the checkpoint holds StackedExperts (Qwen3-VL-MoE), whose router always renormalises its top-k
        weights (transformers' Qwen3VLMoeTextTopKRouter reads no norm_topk_prob)."""
        super().__init__()
        self.num_experts = int(cfg.num_experts)
        self.top_k = int(cfg.num_experts_per_tok)
        self.norm_topk_prob = True if stacked else bool(cfg.norm_topk_prob)
        self.width = int(cfg.moe_intermediate_size)
        self.gate = nn.Linear(cfg.hidden_size, self.num_experts, bias=False)  # the router
        self.experts: nn.Module = (
            StackedExperts(self.num_experts, cfg.hidden_size, self.width) if stacked
            else nn.ModuleList(Expert(cfg.hidden_size, self.width) for _ in range(self.num_experts)))
        self.act = ACT2FN[cfg.hidden_act]
        self.gate_up: torch.Tensor | None = None  # [E, 2 x width, hidden]
        self.down: torch.Tensor | None = None  # [E, hidden, width]

    def fuse(self) -> None:
        """Stack the experts (gate and up side by side, as transformers' Qwen3MoeExperts.gate_up_proj)."""
        if isinstance(self.experts, StackedExperts):
            self.gate_up, self.down = self.experts.gate_up_proj, self.experts.down_proj
            return
        # Parameters, not plain tensors: a weight update copies into the live model's parameters by name.
        self.gate_up = nn.Parameter(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight])
                                                 for e in self.experts]), requires_grad=False)
        self.down = nn.Parameter(torch.stack([e.down_proj.weight for e in self.experts]), requires_grad=False)
        del self.experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k]): transformers' Qwen3MoeTopKRouter."""
        logits = linear(x, self.gate.weight)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gate_up is not None and self.down is not None, "fuse() after loading the weights"
        t, hidden = x.shape
        weights, idx = self.route(x)
        flat = idx.flatten()  # [T * k] expert of each (token, slot) pair
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # one host sync per layer
        rows = x[order // self.top_k]  # [T * k, hidden] each pair's token, grouped by expert
        out = torch.empty_like(rows)
        lo = 0
        for e, n in enumerate(counts):
            if n:
                gate, up = linear(rows[lo:lo + n], self.gate_up[e]).split(self.width, dim=-1)
                out[lo:lo + n] = linear(self.act(gate) * up, self.down[e])
                lo += n
        pairs = torch.empty_like(out)
        pairs[order] = out  # back to (token, slot) order
        # Weighted in the model dtype, then summed over the k slots: transformers adds expert by expert, which
        # rounds the same sum in another order (float32: ~1e-7 apart).
        return (pairs.view(t, self.top_k, hidden) * weights[..., None]).sum(dim=1)
