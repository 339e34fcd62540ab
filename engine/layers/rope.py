"""Rotary position embeddings, computed the way transformers computes them (default, llama3, ...)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def rope_parameters(cfg: Any) -> dict:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return params


class RotaryEmbedding:
    """Not an nn.Module: its buffer is derived from the config, never loaded, so the model can be built
    on `meta` and loaded by name without a stray tensor left unmaterialized."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.params = rope_parameters(cfg)
        self.inv_freq: torch.Tensor | None = None
        self.attention_scaling = 1.0

    def to(self, device: torch.device) -> None:
        rope_type = self.params["rope_type"]
        if rope_type == "default":
            head_dim = getattr(self.cfg, "head_dim", None) or self.cfg.hidden_size // self.cfg.num_attention_heads
            base = self.params["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            scaling = 1.0
        elif rope_type in ROPE_INIT_FUNCTIONS:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](self.cfg, device=torch.device("cpu"))
        else:
            raise ValueError(f"config field rope_parameters (rope_scaling) has rope_type {rope_type!r}, which this "
                             "engine does not implement")
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float)
        self.attention_scaling = float(scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.inv_freq is not None, "RotaryEmbedding.to(device) was not called"
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D], cos/sin: [T, D]."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
