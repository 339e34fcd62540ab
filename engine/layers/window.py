"""Sliding-window and soft-capped attention for TorchPagedAttention.

A windowed layer sees, from a query at position q, the keys at positions q - window + 1 .. q (transformers'
`kv_idx > q_idx - sliding_window`). Keys older than that stay in the paged cache (blocks are shared across
layers, and a full-attention layer still reads them); the backend masks them. Masking is exact in every path the
engine has: prefill, chunked prefill, decode and prefix-cache hits all attend one request's keys by position, and
the hidden-state store keeps the last layer's outputs, which the mask already made right.

Soft-capping (Gemma 2) and attention sinks (gpt-oss) need the scores themselves, so that path is the math one of
transformers' eager attention, op for op: scores * scale, / cap, tanh, * cap, + mask, the sink logit appended as
one more column (a per-head learned logit in the softmax's denominator, with no value row), float32 softmax, the
sink's column dropped, @ V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_mask(start: int, n: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[n, start + n] bool, True where query j (at position start + j) may see key position p: causal, and within
    the window when there is one."""
    qpos = torch.arange(start, start + n, device=device)[:, None]
    kpos = torch.arange(start + n, device=device)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    return mask


def decode_window_bias(bias: torch.Tensor, starts: torch.Tensor, window: int) -> torch.Tensor:
    """The batched decode call's additive mask [B, 1, 1, S_max] with the keys outside each query's window added:
    query b sits at position starts[b] and sees keys from starts[b] - window + 1 on."""
    kpos = torch.arange(bias.shape[-1], device=bias.device)
    old = kpos[None, :] <= starts[:, None] - window  # [B, S_max]
    return bias.masked_fill(old[:, None, None, :], float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
           softcap: float | None, is_causal: bool = False, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA, or with a soft-cap or sinks the eager math path. q: [B, H, n, D]; k, v: [B, H, S, D]; mask: bool
    (True = attend) or additive, broadcastable to [B, H, n, S]; sinks: each head's sink logit, broadcastable to
    [B, H, n, 1] (a caller that folds query heads into another axis shapes it to match)."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, n, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        mask = window_mask(0, q.shape[-2], None, q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    if sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, v)
    sink = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)  # [B, H, n, 1]
    logits = torch.cat([scores, sink], dim=-1).float()
    # Max-subtracted as transformers does (the sink may exceed every score); the sink's column is dropped after.
    logits = logits - logits.amax(dim=-1, keepdim=True)
    weights = torch.softmax(logits, dim=-1)[..., :-1].to(q.dtype)
    return torch.matmul(weights, v)
