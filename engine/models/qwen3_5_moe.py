"""Qwen3.5-MoE: Qwen3.5's hybrid layers (engine/models/qwen3_5.py) with a sparse MoE block on every layer: a softmax
router whose top-k weights are always renormalised, one module per expert as the checkpoints store them
(mlp.experts.{e}.{gate,up,down}_proj: transformers' qwen2_moe conversion stacks them at load, as fuse() does here),
and a shared expert (a dense SwiGLU MLP of shared_expert_intermediate_size) added to every token's output, scaled by
sigmoid(shared_expert_gate(x)) (transformers' Qwen3_5MoeSparseMoeBlock)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.linear import Linear
from engine.layers.moe import Expert, SparseMoeBlock
from engine.models.llama import MLP
from engine.models.qwen3_5 import Qwen3_5ForCausalLM


class SharedExpertMoeBlock(SparseMoeBlock):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, stacked=True)  # stacked: the router renormalises (the config has no norm_topk_prob)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, self.width) for _ in range(self.num_experts))
        self.shared_expert = MLP(cfg, int(cfg.shared_expert_intermediate_size))
        self.shared_expert_gate = Linear(cfg.hidden_size, 1, bias=False)

    def fuse(self) -> None:
        super().fuse()
        self.shared_expert.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden]: routed experts, then the gated shared expert, added in transformers' order."""
        routed = super().forward(x)
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def make_mlp(self, cfg: Any, i: int) -> nn.Module:
        return SharedExpertMoeBlock(cfg)
