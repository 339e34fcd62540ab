"""Mistral: the Llama layout with `sliding_window` on every layer (4096 in v0.1, null from v0.2 on) and an
explicit head_dim (Mistral-Nemo: 128 with hidden 5120 / 32 heads)."""

from __future__ import annotations

from typing import Any

from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import LlamaForCausalLM


def every_layer_window(cfg: Any, i: int) -> int | None:
    """transformers' Mistral / Qwen3-MoE / Phi-3 rule: config.sliding_window, when set, on every layer."""
    return getattr(cfg, "sliding_window", None) or None


class MistralForCausalLM(LlamaForCausalLM):
    layer_window = staticmethod(every_layer_window)

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]
