"""Qwen3-MoE: Qwen3's attention (q/k norms) with sparse MoE MLPs on the layers where
`(i + 1) % decoder_sparse_step == 0` and i is not in `mlp_only_layers` (a dense MLP of intermediate_size there);
sliding_window, when use_sliding_window sets it, on every layer (transformers' Qwen3MoeAttention)."""

from __future__ import annotations

from typing import Any

from engine.layers.moe import SparseMoeBlock
from engine.models.llama import DecoderLayer
from engine.models.mistral import every_layer_window
from engine.models.qwen3 import Qwen3ForCausalLM


def is_sparse(cfg: Any, i: int) -> bool:
    return (i not in (cfg.mlp_only_layers or []) and cfg.num_experts > 0
            and (i + 1) % cfg.decoder_sparse_step == 0)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    layer_window = staticmethod(every_layer_window)

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        layer = super().make_layer(cfg, i)
        if is_sparse(cfg, i):
            layer.mlp = SparseMoeBlock(cfg)
        return layer
