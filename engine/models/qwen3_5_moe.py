"""Qwen3.5-MoE: Qwen3.5's hybrid layers (engine/models/qwen3_5.py) with a sparse MoE block on every layer
(engine/layers/moe.py): a softmax router whose top-k weights are always renormalised (the config has no
norm_topk_prob), one module per expert as the checkpoints store them (mlp.experts.{e}.{gate,up,down}_proj:
transformers' qwen2_moe conversion stacks them at load, as fuse() does here), and a shared expert (a dense SwiGLU MLP
of shared_expert_intermediate_size) added to every token's output, scaled by sigmoid(shared_expert_gate(x))
(transformers' Qwen3_5MoeSparseMoeBlock)."""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.layers.moe import SparseMoeBlock
from engine.models.llama import MLP
from engine.models.qwen3_5 import Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def make_mlp(self, cfg: Any, i: int) -> nn.Module:
        shared = MLP(cfg, int(cfg.shared_expert_intermediate_size))
        return SparseMoeBlock(cfg, norm_topk_prob=True, shared_expert=shared, shared_gate=True)
