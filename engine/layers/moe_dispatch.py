"""The experts' computation of a mixture-of-experts block, in one place so a device may run it its own way: the
(token, expert) pairs arrive sorted by expert, with each expert's count, and every expert multiplies all of its rows
at once (a loop over experts, never over tokens). The layout is the common one of engine/layers/moe.py: gate_up
[E, 2W, H] (gate rows, then up rows), down [E, H, W], optional biases [E, 2W] and [E, H]."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.layers.linear import linear

Activate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def expert_loop(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, activate: Activate
                ) -> torch.Tensor:
    """rows: [N, H] grouped by expert (expert 0's rows first), counts: [E] rows per expert -> [N, H], each row's
    down(activate(gate, up)) under its own expert. One matmul per expert with rows; one host sync for the counts."""
    width = gate_up.shape[1] // 2  # W of this rank's share under tensor parallelism
    out = torch.empty(rows.shape[0], down.shape[1], dtype=rows.dtype, device=rows.device)
    lo = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            b = gate_up_bias[e] if gate_up_bias is not None else None
            gate, up = linear(rows[lo:lo + n], gate_up[e], b).split(width, dim=-1)
            b = down_bias[e] if down_bias is not None else None
            out[lo:lo + n] = linear(activate(gate, up), down[e], b)
            lo += n
    return out


def expert_path(device: torch.device) -> str:
    """"grouped" (engine/layers/moe_triton.py: one launch per projection for all experts) on CUDA with triton;
    "loop" elsewhere: on CPU one matmul per expert is as fast, the launches cost nothing there (bench/device's moe
    section measures the GPU side)."""
    if device.type == "cuda":
        from engine.layers import moe_triton

        if moe_triton.available():
            return "grouped"
    return "loop"


def run_experts(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, activate: Activate
                ) -> torch.Tensor:
    """The experts' rows by the path for rows' device (expert_loop's contract)."""
    if expert_path(rows.device) == "grouped":
        from engine.layers.moe_triton import expert_grouped

        return expert_grouped(rows, counts, gate_up, down, gate_up_bias, down_bias, activate)
    return expert_loop(rows, counts, gate_up, down, gate_up_bias, down_bias, activate)
