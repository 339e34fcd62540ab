"""Sparse mixture-of-experts MLP, the common base of the MoE families (Qwen3-MoE and Qwen3-VL-MoE here; others
subclass it): a router picks top-k experts per token, each expert is a gated MLP, an optional shared expert (a dense
MLP, optionally gated by sigmoid(Linear(hidden -> 1))) is added to the routed sum.

After fuse() every family holds one layout: `gate_up` [E, 2W, H] (gate rows, then up rows), `down` [E, H, W],
optional biases `gate_up_bias` [E, 2W] and `down_bias` [E, H] (None when absent). A family whose checkpoint stores
another layout converts to this one in its own fuse(). Loaded by the checkpoint's names, one of two layouts here:
Qwen3-MoE's one module per expert (mlp.gate.weight, mlp.experts.{e}.{gate,up,down}_proj.weight), stacked by fuse();
or Qwen3-VL-MoE's experts already stacked (mlp.experts.gate_up_proj [E, 2W, H], mlp.experts.down_proj [E, H, W],
transformers 5's Qwen3VLMoeTextExperts), used as they are.

What a family overrides: route() (the router's scores and top-k), activate() (the expert's gate/up activation).
The experts' computation is engine/layers/moe_dispatch.py's, over the (token, expert) pairs sorted by expert.

Under tensor parallelism (engine/parallel/shard.py) each rank holds W/N of every expert's gate/up rows and down
columns (or, with expert parallelism, E/N whole experts: `expert_range`), and `group` is set: the routed and shared
partial sums are added, then all-reduced once."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.activation import activation
from engine.layers.linear import linear
from engine.layers.moe_dispatch import run_experts


class Expert(nn.Module):
    """One expert's weights under the checkpoint's names; folded into SparseMoeBlock's stacks by fuse()."""

    def __init__(self, hidden: int, width: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=bias)
        self.up_proj = nn.Linear(hidden, width, bias=bias)
        self.down_proj = nn.Linear(width, hidden, bias=bias)


class StackedExperts(nn.Module):
    """Every expert's weights in two stacks, under the checkpoint's names (transformers 5's Qwen3VLMoeTextExperts).
    They stay parameters, so a weight update (engine/loading/weight_update.py) reaches them."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * width, hidden))  # gate rows, then up rows
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, width))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: Any, stacked: bool = False, *, num_experts: int | None = None, top_k: int | None = None,
                 width: int | None = None, act: str | None = None, norm_topk_prob: bool | None = None,
                 expert_bias: bool = False, shared_expert: nn.Module | None = None, shared_gate: bool = False
                 ) -> None:
        """Sizes default to Qwen3-MoE's config fields (num_experts, num_experts_per_tok, moe_intermediate_size,
        hidden_act, norm_topk_prob); a family with other names passes them.
        stacked: the checkpoint holds StackedExperts (Qwen3-VL-MoE), whose router always renormalises its top-k
        weights (transformers' Qwen3VLMoeTextTopKRouter reads no norm_topk_prob).
        expert_bias: per-expert modules with biases (stacked into gate_up_bias / down_bias).
        shared_expert: a dense MLP added to every token's routed output (engine.models.llama.MLP); shared_gate:
        scaled by sigmoid(shared_expert_gate(x)) first (Qwen2-MoE, Qwen3.5-MoE)."""
        super().__init__()
        hidden = int(cfg.hidden_size)
        self.num_experts = int(num_experts if num_experts is not None else cfg.num_experts)
        self.top_k = int(top_k if top_k is not None else cfg.num_experts_per_tok)
        self.width = int(width if width is not None else cfg.moe_intermediate_size)
        if norm_topk_prob is None:
            norm_topk_prob = True if stacked else bool(cfg.norm_topk_prob)
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden, self.num_experts, bias=False)  # the router
        self.experts: nn.Module = (
            StackedExperts(self.num_experts, hidden, self.width) if stacked
            else nn.ModuleList(Expert(hidden, self.width, expert_bias) for _ in range(self.num_experts)))
        self.act = activation(act or cfg.hidden_act)
        self.shared_expert = shared_expert
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False) if shared_gate else None
        self.gate_up: torch.Tensor | None = None  # [E, 2W, H]
        self.down: torch.Tensor | None = None  # [E, H, W]
        self.gate_up_bias: torch.Tensor | None = None  # [E, 2W]
        self.down_bias: torch.Tensor | None = None  # [E, H]
        self.group: Any = None  # the TPGroup whose ranks hold the other shares (engine/parallel/shard.py)
        # Expert parallelism: the experts [lo, hi) this rank holds whole (the stacks' rows); None: all of them.
        self.expert_range: tuple[int, int] | None = None

    def fuse(self) -> None:
        """Stack the experts (gate and up side by side, as transformers' Qwen3MoeExperts.gate_up_proj); fuse the
        shared expert's gate/up. A family with another checkpoint layout overrides this and calls fuse_shared()."""
        self.fuse_shared()
        if isinstance(self.experts, StackedExperts):
            self.gate_up, self.down = self.experts.gate_up_proj, self.experts.down_proj
            return
        experts = list(self.experts)
        # Parameters, not plain tensors: a weight update copies into the live model's parameters by name.
        self.gate_up = _frozen(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in experts]))
        self.down = _frozen(torch.stack([e.down_proj.weight for e in experts]))
        if experts[0].gate_proj.bias is not None:
            self.gate_up_bias = _frozen(torch.stack([torch.cat([e.gate_proj.bias, e.up_proj.bias]) for e in experts]))
            self.down_bias = _frozen(torch.stack([e.down_proj.bias for e in experts]))
        del self.experts

    def fuse_shared(self) -> None:
        if self.shared_expert is not None:
            self.shared_expert.fuse()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k]): transformers' Qwen3MoeTopKRouter."""
        logits = linear(x, self.gate.weight, self.gate.bias)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), idx

    def activate(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The expert's hidden from its gate and up halves: act(gate) * up."""
        return self.act(gate) * up

    def routed(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]: each token's k experts' outputs summed with its router weights."""
        assert self.gate_up is not None and self.down is not None, "fuse() after loading the weights"
        t, hidden = x.shape
        weights, idx = self.route(x)
        k = idx.shape[1]
        flat = idx.flatten()  # [T * k] expert of each (token, slot) pair
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts)
        if self.expert_range is None:
            mine = order
            pairs = torch.empty(t * k, hidden, dtype=x.dtype, device=x.device)
        else:  # only the pairs of this rank's experts: a contiguous run of the sorted pairs; the others stay 0
            lo, hi = self.expert_range
            ends = torch.cumsum(counts, 0)
            start, end = torch.stack([ends[lo] - counts[lo], ends[hi - 1]]).tolist()
            mine, counts = order[start:end], counts[lo:hi]
            pairs = torch.zeros(t * k, hidden, dtype=x.dtype, device=x.device)
        rows = x[mine // k]  # [pairs, hidden] each pair's token, grouped by expert
        pairs[mine] = run_experts(rows, counts, self.gate_up, self.down, self.gate_up_bias, self.down_bias,
                                  self.activate)  # back to (token, slot) order
        # Weighted in the model dtype, then summed over the k slots: transformers adds expert by expert, which
        # rounds the same sum in another order (float32: ~1e-7 apart).
        return (pairs.view(t, k, hidden) * weights[..., None]).sum(dim=1)

    def shared(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared expert's output (this rank's partial sum under tensor parallelism), gated; None: none."""
        if self.shared_expert is None:
            return None
        out = self.shared_expert(x)
        if self.shared_expert_gate is not None:
            out = torch.sigmoid(linear(x, self.shared_expert_gate.weight)) * out
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.routed(x)
        shared = self.shared(x)
        if shared is not None:
            out = out + shared
        return self.group.all_reduce(out) if self.group is not None else out


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)
