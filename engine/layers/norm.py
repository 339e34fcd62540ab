"""RMSNorm with transformers' arithmetic, so a checkpoint's norm weights give transformers' values: Llama's, and
Gemma's (scale by (1 + w), all in float32, cast once at the end: Gemma2RMSNorm / Gemma3RMSNorm; Llama instead
casts before scaling by w)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same arithmetic as transformers' LlamaRMSNorm: normalize in float32, scale in the model dtype.
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class Float32ScaleRMSNorm(RMSNorm):
    """gpt-oss's RMSNorm (transformers' GptOssRMSNorm): normalize and scale by w in float32, cast once at the end
    (Llama casts before scaling; the two differ in half precision only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)
