"""LoRA on the engine's (fused) linears, several adapters in one step: each resident adapter has a slot, each row
of the step's flat batch the slot of its request's adapter, and a Linear adds `x A^T B^T` (scaling folded into B)
to the rows of each segment, a run of consecutive rows of one adapter (a request's chunk; neighbours of the same
adapter merged): two small matmuls per segment on weights stored transposed and contiguous, the delta added to the
output rows' view (vLLM's punica "segments", in plain torch). Measured on CPU: gather/scatter (index_select,
index_add_) and addmm_ into a row view both cost several times the matmuls; this form costs about their flops.
Base rows are never touched.

A fused Linear (q/k/v, gate/up) holds each of its parts' adapters side by side: Aᵀ stacks the parts' ranks,
[S, in, parts x R], and Bᵀ is block-diagonal, [S, parts x R, out], so a part's output columns see only its own A.
Ranks below R are zero-padded, and a part an adapter does not target stays zero: adding exact zeros leaves those
columns as the base computed them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoraStep:
    """The step's rows by adapter slot, set by the model runner before each forward (empty: no adapter rows)."""

    # (slot, first row, end row) of each run of consecutive rows of the flat batch whose requests use that slot
    segments: list[tuple[int, int, int]] = field(default_factory=list)


class LoraSlots:
    """One Linear's adapters, by slot. parts: the output widths of the linears fused into it, in order."""

    def __init__(self, step: LoraStep, in_features: int, parts: list[int], num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.step = step
        self.parts = parts
        self.offsets = [sum(parts[:i]) for i in range(len(parts))]
        self.max_rank = max_rank
        width = len(parts) * max_rank
        self.a_t = torch.zeros(num_slots, in_features, width, dtype=dtype, device=device)  # [S, in, P x R]
        self.b_t = torch.zeros(num_slots, width, sum(parts), dtype=dtype, device=device)  # [S, P x R, out]
        self.used = [False] * num_slots

    def set(self, slot: int, part: int, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        """Part `part`'s adapter in `slot`: a [r, in], b [parts[part], r] as PEFT stores them."""
        r = a.shape[0]
        lo = part * self.max_rank
        self.a_t[slot, :, lo:lo + r] = a.t()
        out = self.offsets[part]
        self.b_t[slot, lo:lo + r, out:out + self.parts[part]] = (b * scaling).t()
        self.used[slot] = True

    def clear(self, slot: int) -> None:
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()
        self.used[slot] = False

    def add(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y: [T, out] the base output of x: [T, in]; adds each row's adapter delta in place and returns y."""
        for slot, lo, hi in self.step.segments:
            if not self.used[slot]:
                continue
            y[lo:hi] += (x[lo:hi] @ self.a_t[slot]) @ self.b_t[slot]  # [n, in] -> [n, P x R] -> [n, out]
        return y
