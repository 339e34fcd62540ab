"""Gemma 2: (1 + w) RMSNorm in float32 and four norms per layer (around the attention and around the MLP),
embeddings times sqrt(hidden), GeGLU (hidden_activation, gelu_pytorch_tanh), attention scale
query_pre_attn_scalar ** -0.5, a tanh cap on the attention scores (attn_logit_softcapping) and on the final logits
(final_logit_softcapping: applied before any log-softmax, so every logprob is of the capped logits), sliding and
full layers alternating by layer_types, tied embeddings."""

from __future__ import annotations

from typing import Any

import torch

from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.norm import GemmaRMSNorm
from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import MLP, Attention, DecoderLayer, LlamaForCausalLM


class GemmaDecoderLayer(DecoderLayer):
    """Sandwich norms: h + post_attn_norm(attn(input_norm(h))), then h + post_ff_norm(mlp(pre_ff_norm(h)))."""

    def __init__(self, cfg: Any, attn: Attention, mlp: MLP) -> None:
        super().__init__(cfg, attn, mlp, GemmaRMSNorm)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(h), rope, cos, sin, k_cache, v_cache, meta, backend)
        h = h + self.post_attention_layernorm(a)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Gemma2ForCausalLM(LlamaForCausalLM):
    norm_cls = GemmaRMSNorm

    def __init__(self, cfg: Any) -> None:
        if getattr(cfg, "use_bidirectional_attention", False):
            raise ValueError("config field use_bidirectional_attention is set: this engine implements causal "
                             "attention only")
        super().__init__(cfg)
        self.embed_scale = float(cfg.hidden_size) ** 0.5
        self.final_logit_softcap = getattr(cfg, "final_logit_softcapping", None)

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        bias = bool(getattr(cfg, "attention_bias", False))
        attn = Attention(cfg, bias, bias)
        attn.scale = float(cfg.query_pre_attn_scalar) ** -0.5
        attn.softcap = getattr(cfg, "attn_logit_softcapping", None)
        attn.sliding_window = self.layer_window(cfg, i)
        return GemmaDecoderLayer(cfg, attn, MLP(cfg, act=cfg.hidden_activation))

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]
