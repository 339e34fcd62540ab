"""Phi-3 (and Phi-4-mini): the Llama layout with q/k/v and gate/up already fused in the checkpoint (qkv_proj,
gate_up_proj), partial rotary (rope_parameters.partial_rotary_factor), sliding_window on every layer when set, and
LongRoPE. transformers picks LongRoPE's short or long factors for a whole forward by its length, so a position's
keys would depend on the call they were computed in; the engine serves up to original_max_position_embeddings
(LlamaForCausalLM.position_limit), where the short factors alone apply and every path (chunks, decode, cache
hits) equals transformers."""

from __future__ import annotations

from typing import Any

from engine.layers.linear import Linear
from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import MLP, Attention, DecoderLayer, LlamaForCausalLM
from engine.models.mistral import every_layer_window


class Phi3Attention(Attention):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, qkv_bias=False, o_bias=False)
        del self.q_proj, self.k_proj, self.v_proj
        width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim  # q, then k, then v
        self.qkv_proj = Linear(cfg.hidden_size, width, bias=False)

    def fuse(self) -> None:
        """Fused in the checkpoint already."""


class Phi3MLP(MLP):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        del self.gate_proj, self.up_proj
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate, then up

    def fuse(self) -> None:
        """Fused in the checkpoint already."""


class Phi3ForCausalLM(LlamaForCausalLM):
    def lora_targets(self, i: int) -> dict[str, tuple[Linear, int, list[int]]]:
        """PEFT targets Phi-3's checkpoint-fused linears by their own names, each one part."""
        layer = self.model.layers[i]
        return {name: (linear, 0, [sum(linear.whole_parts([linear.out_features]))]) for name, linear in (
            ("qkv_proj", layer.self_attn.qkv_proj), ("o_proj", layer.self_attn.o_proj),
            ("gate_up_proj", layer.mlp.gate_up_proj), ("down_proj", layer.mlp.down_proj))}

    layer_window = staticmethod(every_layer_window)

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        attn = Phi3Attention(cfg)
        attn.sliding_window = self.layer_window(cfg, i)
        return DecoderLayer(cfg, attn, Phi3MLP(cfg))

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]
