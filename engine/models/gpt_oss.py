"""gpt-oss (GptOssForCausalLM, config gpt_oss): Llama's pre-norm layout with attention biases, attention sinks (a
learned logit per query head in the softmax's denominator, `self_attn.sinks`), sliding and full layers alternating
by layer_types (window `sliding_window`), YaRN rotary (rope_parameters, computed by transformers' own function:
engine/layers/rotary.py), and a sparse MoE MLP on every layer: a router with a bias whose top-k logits are
softmaxed, experts with biases and a clamped SwiGLU (engine/layers/gpt_oss_moe.py). The RMSNorm scales in float32
and casts once (transformers' GptOssRMSNorm). The hub's MXFP4 expert weights are dequantized at load
(engine/loading/mxfp4.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.gpt_oss_moe import GptOssMoeBlock
from engine.layers.norm import Float32ScaleRMSNorm
from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import Attention, DecoderLayer, LlamaForCausalLM


class GptOssForCausalLM(LlamaForCausalLM):
    norm_cls = Float32ScaleRMSNorm

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        bias = bool(getattr(cfg, "attention_bias", True))
        attn = Attention(cfg, bias, bias)
        attn.sliding_window = self.layer_window(cfg, i)
        attn.sinks = nn.Parameter(torch.empty(attn.num_heads))  # [Hq]
        return DecoderLayer(cfg, attn, GptOssMoeBlock(cfg), self.norm_cls)

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]
