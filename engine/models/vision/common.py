"""What the Qwen2-VL family's vision towers share: the 3D patch embedding, the axial 2D rotary embedding over each
head (height frequencies, then width, as transformers' recomposition lays them out) and non-causal attention over
segments (an image, or one of its windows), each a separate softmax."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    """A [T x P x P] Conv3d with stride = kernel over each patch row of pixel_values: [N, C*T*P*P] -> [N, dim]."""

    def __init__(self, patch: int, temporal: int, channels: int, dim: int, bias: bool) -> None:
        super().__init__()
        self.shape = (channels, temporal, patch, patch)
        self.proj = nn.Conv3d(channels, dim, kernel_size=self.shape[1:], stride=self.shape[1:], bias=bias)
        self.dim = dim

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.view(-1, *self.shape).to(self.proj.weight.dtype)
        return self.proj(x).view(-1, self.dim)


def axial_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids: [N, 2] (row, column) of each patch -> cos, sin: [N, head_dim] float32."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
    freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)  # [N, 2, head_dim/4]
    hw = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)  # [N, head_dim/2]
    emb = torch.cat([hw, hw], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisionAttention(nn.Module):
    """Fused qkv (with bias) and an output projection, names `qkv` and `proj` as in the checkpoints."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [N, dim]; cu_seqlens: segment bounds (0, ..., N); cos/sin: [N, head_dim]."""
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, self.head_dim).permute(1, 0, 2, 3).unbind(0)
        c, s = cos[:, None, :].float(), sin[:, None, :].float()  # rotation in float32, as transformers does
        q = (q.float() * c + _rotate_half(q.float()) * s).to(x.dtype)
        k = (k.float() * c + _rotate_half(k.float()) * s).to(x.dtype)
        outs = []
        for lo, hi in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
            qs, ks, vs = (t[lo:hi].transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, len, head_dim]
            outs.append(F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1))
        return self.proj(torch.cat(outs).reshape(n, -1))


class VisionBlock(nn.Module):
    """A pre-norm tower block (names `norm1`, `attn`, `norm2`, `mlp` as in the checkpoints): attention over each
    segment's patches, then the family's MLP. The families differ only in the norm (RMSNorm or LayerNorm) and MLP."""

    def __init__(self, dim: int, num_heads: int, norm: Callable[[int], nn.Module], mlp: nn.Module) -> None:
        super().__init__()
        self.norm1 = norm(dim)
        self.norm2 = norm(dim)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, cu: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cu, cos, sin)
        return x + self.mlp(self.norm2(x))
