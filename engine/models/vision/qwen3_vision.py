"""Qwen3-VL's vision tower: patch embedding (with bias) plus a learned position table resampled bilinearly to the
image's grid, LayerNorm blocks of full attention per frame with an axial 2D RoPE, the merger, and DeepStack: the
outputs of the blocks at `deepstack_visual_indexes`, each through its own merger, go to the decoder's first layers
(engine/models/vision/language.py adds them at the image rows)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

from engine.layers.activation import activation
from engine.layers.embedding import unset_embedding
from engine.models.vision.common import PatchEmbed, VisionBlock, axial_cos_sin


class VisionMLP(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class PatchMerger(nn.Module):
    """LayerNorm over each patch (the final merger) or over the 2 x 2 group (DeepStack's, `postshuffle`), then an
    MLP from the group's concatenated patches to the decoder's width."""

    def __init__(self, cfg: Any, postshuffle: bool) -> None:
        super().__init__()
        self.width = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.act = nn.GELU()
        self.linear_fc2 = nn.Linear(self.width, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width) if self.postshuffle else x).view(-1, self.width)
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Qwen3VisionTower(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.merge = int(cfg.spatial_merge_size)
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size,
                                      bias=True)
        self.pos_embed = unset_embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.side = int(cfg.num_position_embeddings ** 0.5)
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.ModuleList([VisionBlock(cfg.hidden_size, cfg.num_heads, norm, VisionMLP(cfg))
                                     for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg, postshuffle=False)
        # Qwen3.5's tower has none (its config drops the field).
        self.deepstack_indexes = list(getattr(cfg, "deepstack_visual_indexes", None) or [])
        self.deepstack_merger_list = nn.ModuleList([PatchMerger(cfg, postshuffle=True)
                                                    for _ in self.deepstack_indexes])
        self.theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))

    def forward(self, pixels: torch.Tensor, grid_thw: tuple[int, int, int]) -> list[torch.Tensor]:
        """One image's patches [t*h*w, C*T*P*P] -> [embeddings, DeepStack feature of each index], each
        [t*h*w / merge^2, out_hidden]."""
        grid = torch.tensor([grid_thw])
        x = self.patch_embed(pixels.to(self.patch_embed.proj.weight.device))  # [N, dim]
        # transformers' table resampling: align_corners bilinear, patches in merge-block order.
        idx, weights = get_vision_interpolation_indices_and_weights(grid, self.side, mode="bilinear",
                                                                    align_corners=True, spatial_merge_size=self.merge)
        pos = (self.pos_embed(idx.to(x.device)) * weights.to(x.device)[:, :, None]).sum(1)
        x = x + pos.to(x.dtype)
        positions = get_vision_position_ids(grid, self.merge).to(x.device)
        cos, sin = axial_cos_sin(positions, self.cfg.hidden_size // self.cfg.num_heads, self.theta)
        t, h, w = grid_thw
        cu = [i * h * w for i in range(t + 1)]  # each frame its own segment
        deep: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, cu, cos, sin)
            if i in self.deepstack_indexes:
                deep.append(self.deepstack_merger_list[self.deepstack_indexes.index(i)](x))
        return [self.merger(x), *deep]
