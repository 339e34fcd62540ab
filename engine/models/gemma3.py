"""Gemma 3 text (Gemma3ForCausalLM, config gemma3_text): Gemma 2's layout with q/k norms ((1 + w), per head) before
RoPE, no attention soft-cap (transformers' Gemma3Attention does not pass attn_logit_softcapping on, so neither do
we), sliding layers by layer_types (five local per global one) with their own RoPE parameters:
rope_parameters["sliding_attention"] (local base 10k) and rope_parameters["full_attention"] (global base 1M,
linear scaling in the larger checkpoints)."""

from __future__ import annotations

from typing import Any

from engine.layers.norm import GemmaRMSNorm
from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.gemma2 import Gemma2ForCausalLM
from engine.models.llama import DecoderLayer

LAYER_TYPES = ("sliding_attention", "full_attention")  # index = the layer's rope_index


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        layer = super().make_layer(cfg, i)
        attn = layer.self_attn
        attn.softcap = None
        attn.q_norm = GemmaRMSNorm(attn.head_dim, cfg.rms_norm_eps)
        attn.k_norm = GemmaRMSNorm(attn.head_dim, cfg.rms_norm_eps)
        layer.rope_index = LAYER_TYPES.index(cfg.layer_types[i])
        return layer

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg, layer_type) for layer_type in LAYER_TYPES]
