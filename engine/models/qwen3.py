"""Qwen3 (dense): the Llama layout with a per-head RMSNorm on q and k (q_norm, k_norm) before RoPE, an explicit
head_dim, no q/k/v bias (attention_bias sets all four projections' bias), optional sliding layers by layer_types."""

from __future__ import annotations

from typing import Any

from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import DecoderLayer, LlamaForCausalLM, RMSNorm


class Qwen3ForCausalLM(LlamaForCausalLM):
    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        layer = super().make_layer(cfg, i)
        attn = layer.self_attn
        attn.q_norm = RMSNorm(attn.head_dim, cfg.rms_norm_eps)  # over each head's D, shared by the heads
        attn.k_norm = RMSNorm(attn.head_dim, cfg.rms_norm_eps)
        return layer

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]
