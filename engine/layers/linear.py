"""nn.Linear whose vocab-wide CPU float32 matmul (the LM head) goes through oneDNN rather than aten's MKL path.

Measured on a 2-core AVX2 EPYC (torch 2.13, 2 threads): oneDNN's inner product runs the LM head 1.3-2.4x faster
(the scoring blocks and every decode step) and the transformer layers' shapes 1.05-1.3x faster; on a 2-core
AVX-512 Xeon the LM head gains less (1.0-1.3x, 16-512 rows) but never loses. Only the LM head
uses it: through 30 layers its different summation order moved SmolLM2's logprobs by up to 1.4e-4 from the
transformers forward (aten: 1.9e-5), past the 1e-4 the engine is held to; on the LM head alone, 3.8e-5.

Batch-invariant mode needs a row's bits to follow neither the number of rows in the call nor the row's place:
each Linear then carries a RowPlan (engine/invariant/row_plan.py), checked on the running machine when the mode
starts, and every call runs as calls of checked row counts only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.invariant.row_plan import Call, InvariantModeError, RowPlan, calibrate, run_pieces
from engine.layers.lora import LoraSlots, Shard

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


# head_dtype float32 (EngineConfig): the weight's output rows upcast per call, this many at a time.
UPCAST_ROWS = 16384


def float32_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[R, in] x [out, in] -> [R, out] float32, both operands upcast as vLLM's and SGLang's float32 LM head do
    (F.linear(x.float(), weight.float())). The weight is upcast UPCAST_ROWS rows at a time into a new tensor each,
    so no float32 copy of the whole head is held (nor goes stale when weights are updated): the extra memory is one
    slice, UPCAST_ROWS x in x 4 bytes; the extra time one conversion of the weight per call."""
    x = x.float()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    for lo in range(0, weight.shape[0], UPCAST_ROWS):
        hi = min(lo + UPCAST_ROWS, weight.shape[0])
        out[:, lo:hi] = linear(x, weight[lo:hi].float())  # a row's logit is its own dot product
    return out


def linear_into(weight: torch.Tensor, bias: torch.Tensor | None) -> Call:
    """One call of linear() on a block of rows, written into a block of the output: the very call that
    row_plan.calibrate checks, so what runs is what was checked."""
    def call(xt: torch.Tensor, ot: torch.Tensor) -> None:
        if use_onednn(xt, weight):
            ot.copy_(linear(xt, weight, bias))
        elif bias is not None:  # F.linear's own calls, written in place
            torch.addmm(bias, xt, weight.t(), out=ot)
        else:
            torch.mm(xt, weight.t(), out=ot)
    return call


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: RowPlan
                     ) -> torch.Tensor:
    """linear() whose output rows have the same bits whatever the number of rows and their offset: the rows run as
    calls of the plan's checked counts. x: [..., in] -> [..., out]."""
    if torch.get_num_threads() != plan.threads:
        raise InvariantModeError(f"batch-invariant mode was checked at {plan.threads} threads and now runs at "
                                 f"{torch.get_num_threads()}: its bits would move")
    lead, width = x.shape[:-1], x.shape[-1]
    out = run_pieces(x.reshape(-1, width), weight.shape[0], plan, linear_into(weight, bias))
    return out.view(*lead, weight.shape[0])


class Linear(nn.Linear):
    # Set by engine.invariant.mode.set_batch_invariant: None in the default mode.
    row_plan: RowPlan | None = None
    # Set by engine/runner/lora.py when adapters may target this linear: each row's adapter delta is added.
    lora: LoraSlots | None = None
    # Set by engine/parallel/shard.py on a tensor-parallel rank: which share of the whole linear this one is.
    shard: Shard | None = None

    @property
    def whole_in_features(self) -> int:
        """The whole linear's input features (an adapter's A is written for them)."""
        return self.shard.in_features if self.shard is not None else self.in_features

    def whole_parts(self, parts: list[int]) -> list[int]:
        """The whole linear's output widths of its fused parts, given this Linear's own (`parts`)."""
        return list(self.shard.parts) if self.shard is not None else parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_plan is not None:
            return invariant_linear(x, self.weight, self.bias, self.row_plan)
        y = linear(x, self.weight, self.bias)
        return y if self.lora is None else self.lora.add(y, x)

    def calibrate(self, max_rows: int, name: str) -> RowPlan:
        return calibrate(linear_into(self.weight, self.bias), self.in_features, self.out_features,
                         self.weight.dtype, self.weight.device, max_rows, name)
