"""RoPE variants on top of engine/layers/rope.py: a layer type's own parameters (Gemma 3's local and global
bases), partial rotary (Phi-3's `partial_rotary_factor`: only the first fraction of each head turns) and a check,
at model load, that the RoPE type is one the engine computes exactly."""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.layers.rope import RotaryEmbedding

# Types whose frequencies are a fixed function of the config (computed once, as transformers computes them).
# "dynamic" and "longrope" change with the forward's length in transformers: "dynamic" only past
# max_position_embeddings, and "longrope" past original_max_position_embeddings, where the engine stops
# (LlamaForCausalLM.position_limit); "proportional" belongs to other families' layouts.
STATIC_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


class FamilyRotaryEmbedding(RotaryEmbedding):
    def __init__(self, cfg: Any, layer_type: str | None = None) -> None:
        super().__init__(cfg)
        self.layer_type = layer_type
        if layer_type is not None:  # Gemma 3: rope_parameters is {layer type: parameters}
            self.params = dict(cfg.rope_parameters[layer_type])
            self.params.setdefault("rope_type", self.params.get("type", "default"))
        rope_type = self.params["rope_type"]
        if rope_type not in STATIC_TYPES or (rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS):
            raise ValueError(f"config field rope_parameters (rope_scaling) has rope_type {rope_type!r}, which this "
                             f"engine does not implement; supported: {', '.join(STATIC_TYPES)}")
        self.partial = float(self.params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None)
                                             or 1.0))

    def to(self, device: torch.device) -> None:
        if self.params["rope_type"] != "default":
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.params["rope_type"]](
                self.cfg, device=torch.device("cpu"), layer_type=self.layer_type)
        else:  # transformers' compute_default_rope_parameters, with the rotary fraction of the head
            head_dim = getattr(self.cfg, "head_dim", None) or self.cfg.hidden_size // self.cfg.num_attention_heads
            dim = int(head_dim * self.partial)
            base = self.params["rope_theta"]
            inv_freq, scaling = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float)
        self.attention_scaling = float(scaling)

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D], cos/sin: [T, D_rot]; the last D - D_rot dims pass through."""
        d = cos.shape[-1]
        if d == q.shape[-1]:
            return RotaryEmbedding.apply(q, k, cos, sin)
        qr, kr = RotaryEmbedding.apply(q[..., :d], k[..., :d], cos, sin)
        return torch.cat([qr, q[..., d:]], dim=-1), torch.cat([kr, k[..., d:]], dim=-1)
