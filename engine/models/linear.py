"""nn.Linear whose CPU float32 matmul goes through oneDNN rather than aten's MKL path.

Measured on a 2-core AVX2 EPYC (torch 2.13, 2 threads; bench notes in README "Performance"): oneDNN's inner
product runs the shapes of a small Llama 1.05-1.3x faster from 16 rows up, and the vocab-wide LM head 1.3-2.4x
(the scoring blocks and every decode step). For a single row of a narrow layer aten is faster, so one-row
calls keep it. Same dot products, different summation order: values agree to float32 rounding (~1e-6).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ONEDNN = torch.backends.mkldnn.is_available()
# oneDNN wins from this many rows, or for a layer at least this wide whatever the rows (the LM head).
MIN_ROWS = 8
MIN_WIDE_FEATURES = 8192


def use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.dim() == 2 and (x.shape[0] >= MIN_ROWS or weight.shape[0] >= MIN_WIDE_FEATURES))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if use_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
