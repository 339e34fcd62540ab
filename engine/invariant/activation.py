"""The batch-invariant activation kernel: SiLU whose bits do not follow the element's place in the tensor."""

from __future__ import annotations

import torch

from engine.invariant.row_plan import InvariantModeError, machine_name


def invariant_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU whose bits do not depend on the element's place in the tensor: torch's CPU F.silu (and sigmoid) rounds
    its scalar tail unlike its vector lanes, so a row's bits could follow the row count or the thread split; exp
    (vectorized tail included), add and div round the same everywhere."""
    return x / (1.0 + torch.exp(-x))


@torch.inference_mode()
def check_silu(dtype: torch.dtype, device: torch.device) -> None:
    """What invariant_silu takes from torch's exp (its vector lanes and its tail round alike), checked on the
    running machine when the mode starts: the same values at every place of a tensor (tails of 1-32 elements,
    every offset) have the same bits. Raises InvariantModeError otherwise."""
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(4)) * 5).to(dtype=dtype, device=device)
    ref = invariant_silu(x)
    for i in range(0, 3000, 7):
        if not torch.equal(invariant_silu(x[i:i + 33]), ref[i:i + 33]):
            raise InvariantModeError(
                f"batch-invariant mode cannot start: on this machine ({machine_name(device)}, "
                f"{torch.get_num_threads()} threads) torch's exp rounds an element otherwise at another place in "
                "the tensor; run without batch_invariant")
