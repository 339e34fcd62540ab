"""The batch-invariant activation kernel: SiLU whose bits do not follow the element's place in the tensor."""

from __future__ import annotations

import torch


def invariant_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU whose bits do not depend on the element's place in the tensor: torch's CPU F.silu (and sigmoid) rounds
    its scalar tail unlike its vector lanes, so a row's bits could follow the row count or the thread split; exp
    (vectorized tail included), add and div round the same everywhere."""
    return x / (1.0 + torch.exp(-x))
