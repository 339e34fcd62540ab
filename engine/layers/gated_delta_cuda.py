"""The gated delta rule on CUDA from fla-core (flash-linear-attention's Triton kernels: chunk_gated_delta_rule for
prefill chunks, fused_recurrent_gated_delta_rule for decodes), the maintained kernels that vLLM and SGLang also run
for Qwen3.5. fla-core is a dependency (pyproject.toml, pinned: tests/engine/test_gated_delta_kernels.py checks this
version's kernels against the torch reference in Triton's interpreter); it imports only where Triton does, so an
install without Triton keeps the torch reference. fla's own backends (FlashQLA) are used only where their package is
installed, which ours never installs: the Triton kernels are what runs. Chosen only on CUDA and only for
half-precision models: fla's float32 dots round through TF32 on Ampere and newer (~1e-3), past the 1e-4 the engine is
held to, so a float32 model keeps the torch reference (engine/layers/gated_delta.py) everywhere. Same contract as the
reference: q, k [B, L, Hk, Dk]; v [B, L, Hv, Dv]; g, beta [B, L, Hv]; state [B, Hv, Dk, Dv] float32 or None ->
(out [B, L, Hv, Dv] in q's dtype, final state float32). Grouped value heads (Hv > Hk) are fla's own: value head h
reads q/k head h // (Hv / Hk), the reference's repeat_interleave."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

Rule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@cache
def _fla() -> tuple[Rule, Rule] | str:
    """(chunked, recurrent) through fla's kernels, or why fla-core does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001  # no Triton (a CPU install without it): the torch reference serves
        return f"fla-core does not import ({type(e).__name__}: {e})"[:300]

    def wrap(kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Rule:
        def rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            out, final = kernel(q.contiguous(), k.contiguous(), v.contiguous(), g=g.float().contiguous(),
                                beta=beta.contiguous(), initial_state=None if state is None else state.float(),
                                output_final_state=True, use_qk_l2norm_in_kernel=True)
            return out.to(q.dtype), final.float()
        return rule

    return wrap(chunk_gated_delta_rule), wrap(fused_recurrent_gated_delta_rule)


def fla_rules() -> tuple[Rule, Rule] | None:
    """(chunked, recurrent) through fla's kernels; None where fla-core does not import."""
    rules = _fla()
    return None if isinstance(rules, str) else rules


def rule_blocker(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the torch reference serves the gated delta rule here (None: fla's kernels do)."""
    if device.type != "cuda":
        return f"no CUDA device ({device.type})"
    if dtype == torch.float32:
        return "float32 keeps the torch reference (fla's float32 dots round through TF32)"
    rules = _fla()
    return rules if isinstance(rules, str) else None


def cuda_rules(device: torch.device, dtype: torch.dtype) -> tuple[Rule, Rule] | None:
    """fla's rules where they serve (CUDA, half precision, importable), else None."""
    return None if rule_blocker(device, dtype) else fla_rules()
