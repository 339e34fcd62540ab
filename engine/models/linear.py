"""nn.Linear whose vocab-wide CPU float32 matmul (the LM head) goes through oneDNN rather than aten's MKL path.

Measured on a 2-core AVX2 EPYC (torch 2.13, 2 threads): oneDNN's inner product runs the LM head 1.3-2.4x faster
(the scoring blocks and every decode step) and the transformer layers' shapes 1.05-1.3x faster; on a 2-core
AVX-512 Xeon the LM head gains less (1.0-1.3x, 16-512 rows) but never loses. Only the LM head
uses it: through 30 layers its different summation order moved SmolLM2's logprobs by up to 1.4e-4 from the
transformers forward (aten: 1.9e-5), past the 1e-4 the engine is held to; on the LM head alone, 3.8e-5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ONEDNN = torch.backends.mkldnn.is_available()
# Layers at least this wide (the LM head) take oneDNN, whatever the rows.
MIN_WIDE_FEATURES = 8192


def use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.dim() == 2 and weight.shape[0] >= MIN_WIDE_FEATURES)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if use_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
