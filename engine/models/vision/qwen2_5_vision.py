"""Qwen2.5-VL's vision tower: patch embedding, blocks of window attention (full attention at
`fullatt_block_indexes`) with an axial 2D RoPE, and the merger (RMSNorm, then an MLP over each 2 x 2 group of
patches) that yields one decoder embedding per placeholder token. Patches are reordered window by window for
the blocks and back to the processor's order after the merger, as transformers does."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

from engine.layers.activation import activation
from engine.layers.norm import RMSNorm
from engine.models.vision.common import PatchEmbed, VisionBlock, axial_cos_sin


class VisionMLP(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PatchMerger(nn.Module):
    def __init__(self, dim: int, context_dim: int, merge: int) -> None:
        super().__init__()
        self.width = context_dim * merge * merge
        self.ln_q = RMSNorm(context_dim, 1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class Qwen2_5VisionTower(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.merge = int(cfg.spatial_merge_size)
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size,
                                      bias=False)
        norm = partial(RMSNorm, eps=1e-6)
        self.blocks = nn.ModuleList([VisionBlock(cfg.hidden_size, cfg.num_heads, norm, VisionMLP(cfg))
                                     for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg.out_hidden_size, cfg.hidden_size, self.merge)
        self.full = set(cfg.fullatt_block_indexes)
        self.theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))

    def forward(self, pixels: torch.Tensor, grid_thw: tuple[int, int, int]) -> list[torch.Tensor]:
        """One image's patches [t*h*w, C*T*P*P] -> [[t*h*w / merge^2, out_hidden]] (no DeepStack features)."""
        grid = torch.tensor([grid_thw])
        unit = self.merge * self.merge
        window_index, cu_window = get_vision_window_index(grid, self.merge, self.cfg.window_size,
                                                          self.cfg.patch_size)
        t, h, w = grid_thw
        cu_full = [i * h * w for i in range(t + 1)]  # each frame its own segment
        cu_win = cu_window.tolist()
        x = self.patch_embed(pixels.to(self.patch_embed.proj.weight.device))  # [N, dim]
        n = x.shape[0]
        order = window_index.to(x.device)

        def by_window(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(n // unit, unit, -1)[order].reshape(n, -1)

        x = by_window(x)
        positions = get_vision_position_ids(grid, self.merge).to(x.device)
        cos, sin = axial_cos_sin(positions, self.cfg.hidden_size // self.cfg.num_heads, self.theta)
        cos, sin = by_window(cos), by_window(sin)
        for i, block in enumerate(self.blocks):
            x = block(x, cu_full if i in self.full else cu_win, cos, sin)
        return [self.merger(x)[torch.argsort(order)]]
