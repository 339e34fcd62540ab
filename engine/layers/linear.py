"""nn.Linear whose vocab-wide CPU float32 matmul (the LM head) goes through oneDNN rather than aten's MKL path.

Measured on a 2-core AVX2 EPYC (torch 2.13, 2 threads): oneDNN's inner product runs the LM head 1.3-2.4x faster
(the scoring blocks and every decode step) and the transformer layers' shapes 1.05-1.3x faster; on a 2-core
AVX-512 Xeon the LM head gains less (1.0-1.3x, 16-512 rows) but never loses. Only the LM head
uses it: through 30 layers its different summation order moved SmolLM2's logprobs by up to 1.4e-4 from the
transformers forward (aten: 1.9e-5), past the 1e-4 the engine is held to; on the LM head alone, 3.8e-5.

Batch-invariant mode (issue 17) needs a row's bits to follow neither the number of rows in the call nor the row's
place. MKL gives a row other bits when the call has fewer than 16 rows (~3e-5 apart: another kernel), and the same
bits in any call of 16 rows or more: so on CPU in float32 a small call is padded to MIN_ROWS rows, and a large one
runs as it is. Elsewhere (cuBLAS picks kernels and split-K by shape; bfloat16 kernels unmeasured) every matmul runs
in fixed tiles of ROW_TILE rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ONEDNN = torch.backends.mkldnn.is_available()
# Layers at least this wide (the LM head) take oneDNN, whatever the rows.
MIN_WIDE_FEATURES = 8192
# Batch-invariant mode, CPU float32: the fewest rows per call. Measured with MKL and oneDNN (LM head) on SmolLM2's
# shapes at 1 and 2 threads: the same bits at 16 to 2,300 rows and any offset; tests/test_batch_invariant_kernels.py
# asserts it on the machine that runs them.
MIN_ROWS = 16
# Batch-invariant mode elsewhere: every call has this exact shape, so a row's bits depend on its own values only.
ROW_TILE = 64
# MKL's results may depend on the operand's alignment (its CNR notes): an input not on a 64-byte boundary is copied.
ALIGN = 64


def use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.dim() == 2 and weight.shape[0] >= MIN_WIDE_FEATURES)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if use_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear() whose output rows have the same bits whatever the number of rows and their offset (see the module
    docstring). x: [..., in] -> [..., out]."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return tiled_linear(x, weight, bias)
    lead, width = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, width)
    n = x2.shape[0]
    if n < MIN_ROWS:
        padded = x2.new_zeros(MIN_ROWS, width)
        padded[:n] = x2
        return linear(padded, weight, bias)[:n].view(*lead, weight.shape[0])
    if not x2.is_contiguous() or x2.data_ptr() % ALIGN:
        x2 = x2.clone(memory_format=torch.contiguous_format)
        if x2.data_ptr() % ALIGN:  # the allocator aligns fresh tensors: never expected
            return tiled_linear(x, weight, bias)
    return linear(x2, weight, bias).view(*lead, weight.shape[0])


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear() over fixed tiles of ROW_TILE rows, the last one zero-padded: each output row has the same bits
    whatever the number of rows and its offset. x: [..., in] -> [..., out]."""
    lead, width = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, width)
    n = x2.shape[0]
    rows = -(-n // ROW_TILE) * ROW_TILE
    # A fresh, padded copy: every tile starts on an allocator-aligned address, whatever view x was.
    xp = x2.new_zeros(rows, width)
    xp[:n] = x2
    out = x2.new_empty(rows, weight.shape[0])
    wide = use_onednn(xp, weight)
    for lo in range(0, rows, ROW_TILE):
        xt, ot = xp[lo:lo + ROW_TILE], out[lo:lo + ROW_TILE]
        if wide:
            ot.copy_(linear(xt, weight, bias))
        elif bias is not None:  # F.linear's own calls, written in place
            torch.addmm(bias, xt, weight.t(), out=ot)
        else:
            torch.mm(xt, weight.t(), out=ot)
    return out[:n].view(*lead, weight.shape[0])


class Linear(nn.Linear):
    # Set by engine.invariant.set_batch_invariant.
    batch_invariant: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            return invariant_linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias)
