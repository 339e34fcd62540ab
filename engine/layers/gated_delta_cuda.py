"""The gated delta rule on CUDA from fla-core (flash-linear-attention's Triton kernels: chunk_gated_delta_rule for
prefill chunks, fused_recurrent_gated_delta_rule for decodes), the maintained kernels that vLLM and SGLang also run
for Qwen3.5. An optional import: fla-core needs Triton and einops, which the CPU install does not carry, so it is not
a dependency (`pip install fla-core einops` on a GPU machine). Chosen only on CUDA and only for half-precision models:
Triton's float32 dots round through TF32 (~1e-3), past the 1e-4 the engine is held to, so a float32 model keeps the
torch reference (engine/layers/gated_delta.py) everywhere. Same contract as the reference: q, k [B, L, Hk, Dk];
v [B, L, Hv, Dv]; g, beta [B, L, Hv]; state [B, Hv, Dk, Dv] float32 or None -> (out, final state float32)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

Rule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@cache
def fla_rules() -> tuple[Rule, Rule] | None:
    """(chunked, recurrent) through fla's kernels; None where fla-core does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001  # not installed, or no Triton: the torch reference serves
        return None

    def wrap(kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Rule:
        def rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            hk, hv = k.shape[2], v.shape[2]
            if hk != hv:  # grouped value heads, repeated as the reference does
                q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
            out, final = kernel(q.contiguous(), k.contiguous(), v.contiguous(), g=g.float().contiguous(),
                                beta=beta.contiguous(), initial_state=None if state is None else state.float(),
                                output_final_state=True, use_qk_l2norm_in_kernel=True)
            return out.to(q.dtype), final.float()
        return rule

    return wrap(chunk_gated_delta_rule), wrap(fused_recurrent_gated_delta_rule)


def cuda_rules(device: torch.device, dtype: torch.dtype) -> tuple[Rule, Rule] | None:
    """fla's rules where they serve (CUDA, half precision, importable), else None."""
    if device.type != "cuda" or dtype == torch.float32:
        return None
    return fla_rules()
